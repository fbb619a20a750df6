#!/usr/bin/env bash
# Create bench/.venv-mlserver: Seldon MLServer in an environment of its own.
# Why separate: mlserver pins protobuf<7 while ortserve needs protobuf>=7.35 (grpcio-tools 1.85).
# uvloop<0.22: later uvloop releases break mlserver's event-loop setup.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"
start_venv mlserver MLSERVER_VENV
"${pip[@]}" "mlserver" "uvloop<0.22" "onnxruntime" "numpy"
"$venv/bin/python" -c "import mlserver, onnxruntime, google.protobuf as p; print('mlserver', mlserver.__version__, 'onnxruntime', onnxruntime.__version__, 'protobuf', p.__version__)"
finish_venv
