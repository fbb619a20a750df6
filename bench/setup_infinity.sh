#!/usr/bin/env bash
# Create bench/.venv-infinity: infinity-emb 0.0.78 (an embeddings server: OpenAI-style /embeddings, its optimum
# engine runs ONNX through onnxruntime on CPU) in an environment of its own. It needs torch even for the ONNX
# engine: the CPU build goes in first (the wheel on disk when there is one, else torch==2.13.0 as
# scripts/setup.sh installs it) so the resolver never reaches for a CUDA torch; its pins want numpy<2.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/peer_venv.sh"
start_venv infinity INFINITY_VENV
torch=(torch==2.13.0)
[[ -f /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ]] \
  && torch=(/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl)
pip_q "${torch[@]}"
# What infinity-emb's own requirements (optimum[onnxruntime]>=1.24) resolved to on 2026-11-26, pinned. With optimum
# 2.x its graph optimisation step fails ("unexpected keyword argument 'optimize_with_onnxruntime_only'") and it
# serves the graph without it, onnxruntime's own session optimisations applied (it says so in its log); optimum
# 1.27, the last 1.x, cannot be imported beside this torch.
pip_q "infinity-emb[server,optimum]==0.0.78" "optimum==2.1.0" "optimum-onnx==0.1.0" "transformers==4.57.6" \
  "numpy<2" "${torch[@]}"
"$venv/bin/python" - <<'PY'
import sys

import infinity_emb
import onnxruntime
import torch

if torch.version.cuda is not None:
    sys.exit(f"setup_infinity.sh: torch {torch.__version__} is a CUDA build; install the CPU wheel first")
print("infinity_emb", infinity_emb.__version__, "onnxruntime", onnxruntime.__version__, "torch", torch.__version__)
PY
finish_venv
