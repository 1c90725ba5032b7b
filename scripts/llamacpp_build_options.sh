#!/usr/bin/env bash
# Prints the CMake options scripts/setup.sh builds llama.cpp with on this CPU.
#   bash scripts/llamacpp_build_options.sh
#   SPECREPL_CPUINFO=FILE SPECREPL_MACHINE=x86_64 bash scripts/llamacpp_build_options.sh
#
# On an x86 CPU with AVX2: a build for the instruction sets /proc/cpuinfo
# lists (AVX2, and AVX-512 with its VBMI, VNNI and BF16 parts where all the
# AVX-512 subsets llama.cpp compiles with are there), never the AMX paths
# (a native build of llama-cpp-python 0.3.36 crashed in llama_decode on an
# Intel Xeon with AMX) nor weight repacking. Elsewhere (no AVX2, ARM) a
# native build for this CPU, which an AVX2 build would crash on.
# The figures that chose this are in docs/llamacpp.md#builds-and-options.
set -euo pipefail
cpuinfo="${SPECREPL_CPUINFO:-/proc/cpuinfo}"
machine="${SPECREPL_MACHINE:-$(uname -m)}"
flags=" $(grep -m1 '^flags' "$cpuinfo" 2>/dev/null | cut -d: -f2 || true) "
has() { [[ "$flags" == *" $1 "* ]]; }
if [ "$machine" != x86_64 ] || ! has avx2; then
  echo "-DGGML_NATIVE=ON"
  exit 0
fi
options="-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
  options="$options -DGGML_AVX512=ON"
  if has avx512vbmi; then options="$options -DGGML_AVX512_VBMI=ON"; fi
  if has avx512_vnni; then options="$options -DGGML_AVX512_VNNI=ON"; fi
  if has avx512_bf16; then options="$options -DGGML_AVX512_BF16=ON"; fi
fi
echo "$options -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_REPACK=OFF"
