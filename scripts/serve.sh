#!/usr/bin/env bash
# The main job: set up, start the server at once on model_repository (empty or not), then build the default models
# beside it (train -> export -> parity gate -> publish), each joining the server as soon as it passes its gate:
# the real all-MiniLM-L6-v2 as the embedding model "minilm" first (no training), then the others, quickest first.
# gRPC on ${PORT:-8001}, HTTP (KServe v2 REST, OpenAI API) on ${HTTP_PORT:-8000}, metrics on ${METRICS_PORT:-8002}.
# The server logs to artifacts/logs/server.log (the terminal keeps the build's progress bars); `ortserve models`
# lists the models still being built with their stage. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
. .venv/bin/activate
mkdir -p model_repository artifacts/logs
log=artifacts/logs/server.log
echo "server: gRPC ${HOST:-127.0.0.1}:${PORT:-8001}, HTTP :${HTTP_PORT:-8000}, metrics :${METRICS_PORT:-8002}; its log: $log"
python -m server --repository model_repository --host "${HOST:-127.0.0.1}" --port "${PORT:-8001}" \
  --http-port "${HTTP_PORT:-8000}" --metrics-port "${METRICS_PORT:-8002}" --poll-interval 2 "$@" >>"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
for _ in $(seq 60); do      # up within a minute, or its log says why not
  grep -q "listening on" "$log" 2>/dev/null && break
  if ! kill -0 "$server" 2>/dev/null; then echo "server failed to start:"; tail -n 5 "$log"; exit 1; fi
  sleep 1
done
echo "server up; building the models (each serves as soon as it passes its gate; logs in artifacts/logs/)"
if python -m pipeline --workdir artifacts --repository model_repository --embed minilm --g2p --punctuate --quiet; then
  echo "every model built and serving; the server goes on (Ctrl-C stops it)"
else
  echo "some models failed to build (above: which step, and its log); the others serve (Ctrl-C stops the server)"
fi
wait "$server"
