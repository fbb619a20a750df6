#!/usr/bin/env bash
# Create bench/.venv-genai: onnxruntime-genai 0.18.0 (runs our in-place decoder graph in-process as its
# "decoder" model type, ../shared/NOTES.md) with the same onnxruntime as ortserve.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"
start_venv genai GENAI_VENV
"${pip[@]}" "onnxruntime==1.32.0" "onnxruntime-genai==0.18.0" "numpy"
"$venv/bin/python" -c "import onnxruntime_genai as og, onnxruntime as ort; print('genai', og.__version__, 'onnxruntime', ort.__version__)"
finish_venv
