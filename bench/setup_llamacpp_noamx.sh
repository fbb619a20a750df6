#!/usr/bin/env bash
# A second build of the llama.cpp peer's server and bench tools, with Intel AMX left out, into
# bench/.venv-llamacpp/noamx/bin. Why: on an AMX CPU (2026-11-26, Intel Xeon with amx_int8) the native build's
# llama-server dies with SIGSEGV in ggml_backend_amx_mul_mat while warming up on a Q8_0 or Q4_0 model, and its
# only switch around that path (--no-repack) also turns off the AVX-512 repacked kernels, halving its batch-1
# decode. This build keeps every other vector extension of the CPU (the flags GGML_NATIVE would have picked) and
# the repacked kernels. bench/llamacpp.py starts llama-server from it when the native one crashes.
# Needs bench/setup_llamacpp.sh first (its source tree); ~8 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LLAMACPP_VENV:-$here/.venv-llamacpp}"
src="$venv/src/llama.cpp"
out="$venv/noamx/bin"
jobs="${JOBS:-$(nproc)}"
[[ -d "$src" ]] || { echo "setup_llamacpp_noamx.sh: $src missing (run bench/setup_llamacpp.sh first)" >&2; exit 1; }
if [[ -x "$out/llama-server" && -x "$out/llama-bench" ]]; then
  echo "llama.cpp (no AMX) ready: $out"
  exit 0
fi
flag() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
cd "$src"
rm -rf build-noamx
cmake -B build-noamx -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_AVX="$(flag avx)" -DGGML_AVX2="$(flag avx2)" -DGGML_BMI2="$(flag bmi2)" -DGGML_FMA="$(flag fma)" \
  -DGGML_F16C="$(flag f16c)" -DGGML_AVX_VNNI="$(flag avx_vnni)" -DGGML_AVX512="$(flag avx512f)" \
  -DGGML_AVX512_VBMI="$(flag avx512vbmi)" -DGGML_AVX512_VNNI="$(flag avx512_vnni)" \
  -DGGML_AVX512_BF16="$(flag avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  >"$venv/cmake-noamx-configure.log" 2>&1 || { tail -20 "$venv/cmake-noamx-configure.log" >&2; exit 1; }
started=$(date +%s)
echo "building llama.cpp without AMX with $jobs jobs (log: $venv/cmake-noamx-build.log)"
cmake --build build-noamx -j"$jobs" --target llama-bench llama-server >"$venv/cmake-noamx-build.log" 2>&1 \
  || { tail -20 "$venv/cmake-noamx-build.log" >&2; exit 1; }
echo "built in $(( $(date +%s) - started )) s"
mkdir -p "$out.tmp"
cp build-noamx/bin/llama-bench build-noamx/bin/llama-server "$out.tmp/"
rm -rf build-noamx "$out"
mv "$out.tmp" "$out"
