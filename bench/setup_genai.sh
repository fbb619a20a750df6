#!/usr/bin/env bash
# Create bench/.venv-genai: onnxruntime-genai 0.18.0 (runs our in-place decoder graph in-process as its
# "decoder" model type, ../shared/NOTES.md) with the same onnxruntime as ortserve.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${GENAI_VENV:-$here/.venv-genai}"
python="${PYTHON:-python3.11}"
if [[ -f "$venv/.complete" ]]; then
  echo "genai venv ready: $venv"
  exit 0
fi
rm -rf "$venv"
trap 'rm -rf "$venv"' ERR
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "onnxruntime==1.32.0" "onnxruntime-genai==0.18.0" "numpy"
"$venv/bin/python" -c "import onnxruntime_genai as og, onnxruntime as ort; print('genai', og.__version__, 'onnxruntime', ort.__version__)"
touch "$venv/.complete"
