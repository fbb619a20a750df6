"""`python -m training <command>`: tokenizer | mlm | classify | token-classify | lm | g2p | data.

Every command has recipe defaults (Shakespeare corpus, step counts sized for a few minutes on 2 CPU cores):
"pretrained" when `--init` is a pretrained encoder (`--init minilm`: the packaged all-MiniLM-L6-v2, what the
default models start from), "scratch" for `small` models from random weights; and the artifacts/ layout:
artifacts/tokenizers/{wordpiece,bpe}, artifacts/checkpoints/{mlm,classifier,lm}. `--arch`
selects the model family (mlm/classify: bert | roberta | albert, classify also distilbert and electra from an
HF checkpoint via --init; lm: gpt2 | llama); other families default to artifacts/checkpoints/<cmd>-<arch>.
`g2p` trains the original Transformer (a Marian checkpoint) on CMUdict grapheme-to-phoneme; its --preset
(tiny | default | long) is a whole recipe, model shape included: artifacts/checkpoints/g2p.
Bad input prints one `error: ...` line and exits with code 2.
"""
from __future__ import annotations

import time

_STARTED = time.monotonic()  # wall time of a run counts from process start (imports, data prep)

import logging
import sys
from typing import Sequence

from training.checkpoint import CheckpointError
from training.cli import build_parser
from training.commands import COMMANDS, CliError
from training.errors import DataError


def _setup_logging(quiet: bool, is_main: bool = True) -> None:
    level = logging.WARNING if quiet or not is_main else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    import os
    a = build_parser().parse_args(argv)
    a.started_at = _STARTED
    _setup_logging(a.quiet, is_main=os.environ.get("RANK", "0") == "0")
    from training.tokenizer import TokenizerError
    from training.trainer import TrainError
    try:
        return COMMANDS[a.command](a)
    except (DataError, TokenizerError, CheckpointError, TrainError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, --out under a file, an unreadable corpus: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        # Config dataclasses / presets reject bad values with ValueError("field: ...").
        msg = str(exc)
        if ":" in msg.split(" ")[0]:
            print(f"error: {msg}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
