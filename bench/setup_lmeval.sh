#!/usr/bin/env bash
# Create bench/.venv-lmeval: EleutherAI's lm-evaluation-harness 0.4.13, a client of the OpenAI door's
# /v1/completions (echo + logprobs scoring), and torch for its "hf" model, the in-process reference
# (bench/lm_eval_check.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LMEVAL_VENV:-$here/.venv-lmeval}"
python="${PYTHON:-python3.11}"
if [[ -f "$venv/.complete" ]]; then
  echo "lm-eval venv ready: $venv"
  exit 0
fi
rm -rf "$venv"
trap 'rm -rf "$venv"' ERR
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "lm-eval[api,hf]==0.4.13" "transformers==5.23.0"
"$venv/bin/python" -c "import lm_eval, torch; print('lm-eval', lm_eval.__version__, 'torch', torch.__version__)"
touch "$venv/.complete"
