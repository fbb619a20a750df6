#!/usr/bin/env bash
# Sets up the environment and runs the test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q -m "not slow" -p no:cacheprovider "$@"
