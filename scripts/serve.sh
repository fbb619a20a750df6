#!/usr/bin/env bash
# The main job: set up, build the default models if absent (train -> export -> parity gate -> publish),
# plus the real all-MiniLM-L6-v2 as the embedding model "minilm", then serve them on gRPC port ${PORT:-8001},
# HTTP (KServe v2 REST, OpenAI API) on ${HTTP_PORT:-8000}, metrics on ${METRICS_PORT:-8002}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
. .venv/bin/activate
python -m pipeline --workdir artifacts --repository model_repository --embed minilm --g2p --punctuate --quiet
exec python -m server --repository model_repository --host "${HOST:-127.0.0.1}" --port "${PORT:-8001}" \
  --http-port "${HTTP_PORT:-8000}" --metrics-port "${METRICS_PORT:-8002}" "$@"
