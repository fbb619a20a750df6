#!/usr/bin/env bash
# The main job: set up, build the default models if absent (train -> export -> parity gate -> publish),
# then serve them on gRPC port ${PORT:-8001} (metrics on ${METRICS_PORT:-8002}).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
. .venv/bin/activate
python -m pipeline --workdir artifacts --repository model_repository --quiet
exec python -m server --repository model_repository --host "${HOST:-127.0.0.1}" --port "${PORT:-8001}" \
  --metrics-port "${METRICS_PORT:-8002}" "$@"
