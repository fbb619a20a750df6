#!/usr/bin/env bash
# Create bench/.venv-mlserver: Seldon MLServer in an environment of its own.
# Why separate: mlserver pins protobuf<7 while ortserve needs protobuf>=7.35 (grpcio-tools 1.85).
# uvloop<0.22: later uvloop releases break mlserver's event-loop setup.
# A venv hard-codes its own path, so it is built in place; `.complete` marks a finished one and an
# unfinished one is removed and rebuilt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${MLSERVER_VENV:-$here/.venv-mlserver}"
python="${PYTHON:-python3.11}"
if [[ -f "$venv/.complete" ]]; then
  echo "mlserver venv ready: $venv"
  exit 0
fi
rm -rf "$venv"
trap 'rm -rf "$venv"' ERR
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "mlserver" "uvloop<0.22" "onnxruntime" "numpy"
"$venv/bin/python" -c "import mlserver, onnxruntime, google.protobuf as p; print('mlserver', mlserver.__version__, 'onnxruntime', onnxruntime.__version__, 'protobuf', p.__version__)"
touch "$venv/.complete"
