#!/usr/bin/env bash
# Regenerates the Python stubs next to the .proto files (committed; a test fails when they are stale).
# Usage: bash scripts/gen_protos.sh [OUT_DIR]   (default: the repository root, i.e. in place)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
python -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" protos/*.proto

# The KServe messages (package `inference`) go into a private descriptor pool instead of the default
# one: tritonclient and other KServe clients register their own `inference.*` copies in the default
# pool, and two files defining the same symbol there fail at import ("duplicate symbol").
python - "$out/protos/grpc_service_pb2.py" <<'EOF'
import pathlib, sys
path = pathlib.Path(sys.argv[1])
text = path.read_text()
old = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
new = ("# ortserve: a private pool, see scripts/gen_protos.sh.\n"
       "POOL = _descriptor_pool.DescriptorPool()\n"
       "DESCRIPTOR = POOL.AddSerializedFile(")
if text.count(old) != 1:
    sys.exit(f"gen_protos.sh: unexpected protoc output in {path}")
path.write_text(text.replace(old, new))
EOF
