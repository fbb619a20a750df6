#!/usr/bin/env bash
# Five example calls of each default model through the CLI, as a user sees them: the "Example outputs" of
# docs/MODELS.md are this script's output against `bash scripts/serve.sh` (ADDRESS defaults to 127.0.0.1:8001).
# Texts come from the held-out plays (never seen in training) or are not Shakespeare at all.
set -euo pipefail
cd "$(dirname "$0")/.."
ORTSERVE=(.venv/bin/ortserve --address "${ADDRESS:-127.0.0.1:8001}")
run() { printf '$ ortserve'; printf " '%s'" "$@"; printf '\n'; "${ORTSERVE[@]}" "$@"; echo; }

run classify "O, pardon me, thou bleeding piece of earth, that I am meek and gentle with these butchers!"
run classify "Once more unto the breach, dear friends, once more; or close the wall up with our English dead."
run classify "The course of true love never did run smooth."
run classify "Sigh no more, ladies, sigh no more, men were deceivers ever."
run classify "My lord, the French are landed at Milford Haven."

run fill-mask "to be or not to [MASK], that is the question"
run fill-mask "The course of true [MASK] never did run smooth."
run fill-mask "Now is the winter of our [MASK]."
run fill-mask "Good night, sweet [MASK], and flights of angels sing thee to thy rest."
run fill-mask "I will [MASK] thee to the court of France."

SAMPLING=(--max-new-tokens 60 --temperature 0.8 --top-p 0.9 --repetition-penalty 1.2)
run generate "ROMEO." --seed 1 "${SAMPLING[@]}"
run generate "KING HENRY." --seed 2 "${SAMPLING[@]}"
run generate "HAMLET.
To be, or not to be," --seed 3 "${SAMPLING[@]}"
run generate "First Citizen." --seed 4 "${SAMPLING[@]}"
run generate "My lord," --seed 5 "${SAMPLING[@]}"
