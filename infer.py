"""Entry point: `python infer.py` starts the specrepl REPL (see specrepl/cli.py)."""

import sys

try:
    from specrepl.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch and transformers are imported
    sys.stderr.write("Interrupted while starting.\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())
