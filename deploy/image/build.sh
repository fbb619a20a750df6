#!/usr/bin/env bash
# Builds the ortserve server image from deploy/image/Containerfile.
#   deploy/image/build.sh [TAG] [BASE]      (defaults: ortserve-server:0.1.0, the Containerfile's BASE)
# 1. fills deploy/image/wheels/ with the server's wheels (the base install's pins from constraints.txt: no torch),
#    downloaded by this machine's pip for this machine's Python and platform, so the image build needs no network
#    and the image's python3 must be the same CPython minor (3.11) on the same platform;
# 2. `podman build --network=none` (or buildah bud / docker build when podman is missing).
# BUILD_ISOLATION=chroot: buildah's chroot isolation instead of an OCI runtime for the RUN steps (where the runtime
# cannot start containers, as on this VM: deploy/image/README.md); it shares the host's network, and the build
# still fetches nothing (PIP_NO_INDEX in the Containerfile).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-ortserve-server:0.1.0}
BASE=${2:-}
PY=${PYTHON:-.venv/bin/python}
WHEELS=deploy/image/wheels
mkdir -p "$WHEELS"
# The server's dependencies as pinned (only the [project] dependencies: no extras, so no torch), and setuptools
# to build ortserve's own wheel inside the image.
deps=$("$PY" - <<'EOF'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
EOF
)
mapfile -t reqs <<<"$deps"
log=$(mktemp)
if ! "$PY" -m pip download --disable-pip-version-check -q --only-binary=:all: -d "$WHEELS" -c constraints.txt \
    "${reqs[@]}" "setuptools>=68" >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
if ls "$WHEELS" | grep -qi '^torch'; then echo "build.sh: torch in the wheelhouse" >&2; exit 1; fi
args=(-f deploy/image/Containerfile -t "$TAG")
if [ -n "${BUILD_ISOLATION:-}" ]; then args+=(--isolation="$BUILD_ISOLATION"); else args+=(--network=none); fi
[ -n "$BASE" ] && args+=(--build-arg "BASE=$BASE")
if command -v podman >/dev/null; then
  exec podman build "${args[@]}" .
elif command -v buildah >/dev/null; then
  exec buildah bud "${args[@]}" .
else
  exec docker build "${args[@]}" .
fi
