#!/usr/bin/env bash
# Create the llama.cpp peer's two environments:
#   bench/.venv-llamacpp  llama.cpp's tools (llama-bench, llama-server, llama-quantize) built from the vendored tree
#                         of the llama-cpp-python 0.3.36 sdist (no prebuilt binaries can be downloaded here), kept in
#                         $venv/bin; the source tree stays in $venv/src/llama.cpp for its converter.
#   bench/.venv-gguf      the converter's Python (convert_hf_to_gguf.py + the vendored gguf-py) with its own
#                         transformers (it pins 4.x; ortserve runs 5.x), sentencepiece and torch.
# The build takes ~8 minutes on 2 cores (../shared/NOTES.md). bench/llamacpp.py uses both environments.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/peer_venv.sh"
version=0.3.36
jobs="${JOBS:-$(nproc)}"

(
  start_venv llamacpp LLAMACPP_VENV
  for tool in cmake gcc g++ make; do
    command -v "$tool" >/dev/null || { echo "setup_llamacpp.sh: $tool not found (needed to build llama.cpp)" >&2; exit 1; }
  done
  mkdir -p "$venv/src"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$venv/src"
  tar xzf "$venv/src/llama_cpp_python-$version.tar.gz" -C "$venv/src"
  mv "$venv/src/llama_cpp_python-$version/vendor/llama.cpp" "$venv/src/llama.cpp"
  rm -rf "$venv/src/llama_cpp_python-$version" "$venv/src/llama_cpp_python-$version.tar.gz"
  cd "$venv/src/llama.cpp"
  # Static tools (they are copied out of the build tree); native: this machine's vector units, as its docs build.
  cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$venv/cmake-configure.log" 2>&1 \
    || { tail -20 "$venv/cmake-configure.log" >&2; exit 1; }
  started=$(date +%s)
  echo "building llama.cpp with $jobs jobs (log: $venv/cmake-build.log)"
  cmake --build build -j"$jobs" --target llama-bench llama-server llama-quantize >"$venv/cmake-build.log" 2>&1 \
    || { tail -20 "$venv/cmake-build.log" >&2; exit 1; }
  echo "built in $(( $(date +%s) - started )) s"
  cp build/bin/llama-bench build/bin/llama-server build/bin/llama-quantize "$venv/bin/"
  rm -rf build
  "$venv/bin/llama-bench" --version 2>&1 | head -2
  finish_venv
)

llamacpp="${LLAMACPP_VENV:-$here/.venv-llamacpp}"
(
  start_venv gguf GGUF_VENV
  # torch: the CPU wheel on disk when there is one (the converter imports torch; it only reads tensors with it).
  torch=(torch==2.13.0)
  [[ -f /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ]] \
    && torch=(/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl)
  "${pip[@]}" "${torch[@]}"
  "${pip[@]}" "transformers==4.57.6" "sentencepiece==0.2.3" "numpy~=2.2.6" "safetensors" "tokenizers" \
    "protobuf>=4.21.0,<5.0.0" "$llamacpp/src/llama.cpp/gguf-py"
  "$venv/bin/python" -c "import gguf, transformers, sentencepiece, torch; print('gguf', gguf.__file__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
  finish_venv
)
