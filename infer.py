"""Entry point: `python infer.py` starts the specrepl REPL (see specrepl/app/cli.py)."""

from specrepl.app.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
