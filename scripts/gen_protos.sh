#!/usr/bin/env bash
# Regenerates the Python stubs next to the .proto files (committed; a test fails when they are stale).
# Usage: bash scripts/gen_protos.sh [OUT_DIR]   (default: the repository root, i.e. in place)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
python -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" protos/*.proto
