#!/usr/bin/env bash
# Create bench/.venv-ct2: CTranslate2 4.8.5 (the CPU wheel from PyPI: batch translation, int8) in an environment of
# its own, with what its converter (`ct2-transformers-converter`) needs to read a Hugging Face checkpoint:
# transformers (the project's pin) and torch. torch first, the CPU build: the wheel on disk when there is one
# (same build as the project's), else `torch==2.13.0` as scripts/setup.sh installs it; the resolver then never
# reaches for a CUDA torch, and the check below refuses one that came anyway.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/peer_venv.sh"
start_venv ct2 CT2_VENV
torch=(torch==2.13.0)
[[ -f /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ]] \
  && torch=(/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl)
pip_q "${torch[@]}"
transformers=$(grep -E '^transformers==' "$here/../constraints.txt")
pip_q "ctranslate2==4.8.5" "$transformers" "${torch[@]}"
"$venv/bin/python" - <<'PY'
import sys

import ctranslate2
import torch
import transformers

if torch.version.cuda is not None:
    sys.exit(f"setup_ct2.sh: torch {torch.__version__} is a CUDA build; install the CPU wheel first")
print("ctranslate2", ctranslate2.__version__, "transformers", transformers.__version__, "torch", torch.__version__,
      "cpu int8:", "int8" in ctranslate2.get_supported_compute_types("cpu"))
PY
finish_venv
