#!/usr/bin/env bash
# Runs the built image on a model repository and checks it: ready over HTTP and grpc.health.v1 (the probes'
# services), running as uid 10001, a model's metadata, then SIGTERM (podman stop) reaches the server, which
# drains and exits 0 well before the stop timeout. Exit 0 when all of that holds, 1 with the reason otherwise.
#   deploy/image/smoke.sh REPOSITORY [IMAGE]        (IMAGE default: localhost/ortserve-server:0.1.0)
# RUNTIME_ARGS: extra `podman` global flags (here: --runtime runc; see deploy/image/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(realpath "${1:?usage: smoke.sh REPOSITORY [IMAGE]}")
IMAGE=${2:-localhost/ortserve-server:0.1.0}
PY=${PYTHON:-.venv/bin/python}
read -r -a P <<<"podman ${RUNTIME_ARGS:-}"
NAME=ortserve-smoke-$$
HTTP=18080 GRPC=18081 METRICS=18082
fail() { echo "smoke.sh: $*" >&2; "${P[@]}" logs "$NAME" 2>&1 | tail -20 >&2; "${P[@]}" rm -f "$NAME" >/dev/null 2>&1; exit 1; }
# Low explicit limits: this VM refuses the runtime's default RLIMIT_NOFILE / NPROC (deploy/image/README.md).
"${P[@]}" run -d --name "$NAME" --network=host --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
  -v "$REPO":/mnt/models:ro "$IMAGE" --repository /mnt/models --host 127.0.0.1 \
  --http-port $HTTP --port $GRPC --metrics-port $METRICS --grace-period 3 >/dev/null
for _ in $(seq 120); do
  curl -sf -m 2 "localhost:$HTTP/v2/health/ready" >/dev/null && break
  sleep 0.5
done
curl -sf -m 2 "localhost:$HTTP/v2/health/ready" >/dev/null || fail "not ready within 60 s"
"$PY" - "$GRPC" <<'EOF' || fail "grpc.health.v1 probes"
import sys, grpc
from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as rpc
with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}") as ch:
    for service in ("", "liveness"):
        assert rpc.HealthStub(ch).Check(pb.HealthCheckRequest(service=service), timeout=5).status == pb.HealthCheckResponse.SERVING
EOF
user=$("${P[@]}" exec "$NAME" id -u)
[ "$user" = 10001 ] || fail "runs as uid $user, not 10001"
first=$(ls "$REPO" | head -1)
curl -sf -m 10 "localhost:$HTTP/v2/models/$first" >/dev/null || fail "GET /v2/models/$first"
start=$(date +%s)
"${P[@]}" stop -t 30 "$NAME" >/dev/null
took=$(( $(date +%s) - start ))
code=$("${P[@]}" inspect "$NAME" --format '{{.State.ExitCode}}')
"${P[@]}" logs "$NAME" 2>&1 | grep -q 'signal received' || fail "the server never saw SIGTERM"
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
[ "$took" -lt 20 ] || fail "stop took ${took}s: SIGTERM did not reach the server (killed at the timeout)"
"${P[@]}" rm -f "$NAME" >/dev/null
echo "smoke.sh: ok ($IMAGE: ready, probes SERVING, uid $user, SIGTERM -> drained, exit 0 in ${took}s)"
