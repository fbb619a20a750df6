#!/usr/bin/env bash
# Create bench/.venv-lmeval: EleutherAI's lm-evaluation-harness 0.4.13, a client of the OpenAI door's
# /v1/completions (echo + logprobs scoring), and torch for its "hf" model, the in-process reference
# (bench/lm_eval_check.py).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/peer_venv.sh"
start_venv lmeval LMEVAL_VENV
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "lm-eval[api,hf]==0.4.13" "transformers==5.23.0"
"$venv/bin/python" -c "import lm_eval, torch; print('lm-eval', lm_eval.__version__, 'torch', torch.__version__)"
finish_venv
