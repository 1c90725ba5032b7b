"""Entry point: `python infer.py` starts the specrepl REPL (see specrepl/cli.py)."""

from specrepl.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
