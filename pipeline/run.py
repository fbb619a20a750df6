"""The whole chain: tokenizers -> MLM -> classifier -> LM (-> g2p, punctuation) -> export + publish -> (optionally)
a live server."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from clients.cli_args import DEFAULT_MODELS
from clients.config import ClientConfig
from training import recipes

from .errors import PipelineError
from .publish import publish
from .server import load_into_server
from .status import BuildBoard, training_progress
from .steps import run_command, stamp, step_key, up_to_date

log = logging.getLogger("ortserve.pipeline")


@dataclass
class PipelineConfig:
    workdir: Path = Path("artifacts")
    repository: Path = Path("model_repository")
    corpus: list[Path] = field(default_factory=list)  # empty = the default Shakespeare corpus
    preset: str | None = None                          # None = each trainer's default (small)
    names: dict[str, str] = field(default_factory=lambda: {**DEFAULT_MODELS, "g2p": "g2p"})  # stage -> published name
    # The encoder-decoder: grapheme-to-phoneme trained on CMUdict (training/tasks/g2p.py), published as "g2p". Off
    # unless asked (`--g2p`; the main command asks): the default recipe takes minutes (docs/MODELS.md, "Results").
    g2p: bool = False
    # Punctuation and casing restoration: MiniLM fine-tuned as a token classifier on the corpus's own marks and
    # capitals (training/punctuation.py), published as "punctuate". Off unless asked (`--punctuate`; the main
    # command asks): minutes of training (docs/MODELS.md, "Punctuation and casing restoration").
    punctuate: bool = False
    # "minilm": fill-mask continues MLM training from the packaged MiniLM (its tokenizer) and the classifier is
    # fine-tuned from MiniLM; "scratch": a WordPiece tokenizer and a BERT pre-trained from random weights on the
    # corpus, the classifier fine-tuned from it (any language, e.g. Chinese: README).
    encoder: str = "minilm"
    minilm: Path | None = None                         # the MiniLM dir (encoder "minilm")
    classify_init: Path | None = None                  # an HF BERT dir to fine-tune instead of the default
    embed_checkpoint: Path | None = None               # an encoder to publish as the embedding model (--embed)
    embed_matryoshka: bool = False                     # its package declares Matryoshka vectors (--embed-matryoshka)
    classify_data: list[Path] = field(default_factory=list)  # [train, validation, test] JSONL/CSV
    steps: dict[str, int] = field(default_factory=dict)      # per-stage step overrides (tests use tiny runs)
    threads: int | None = None                         # torch threads per training run (None: the trainer's)
    server: ClientConfig | None = None                 # a running server to load new versions into
    # int8 (export/int8.py) is asked for the punctuation restorer, where it passes the gate and runs faster than the
    # fp32 graph (docs/MODELS.md, "int8 that passes"); a variant the gate refuses leaves the package alone. Not for
    # the genre classifier: it agrees with fp32 on too few of the genre test split for the gate (docs/model-package.md,
    # "Variants") and judging it runs the 2674 passages once more.
    # The decoder ships its weight-quantized variants (8 / 4 bits, 4 bits over an int8 cache): one the gate refuses
    # leaves the package alone, and the CPU default is the fastest that passed (docs/model-package.md).
    variants: dict[str, str] = field(default_factory=lambda: {"classify": "fp32,optimized",
                                                             "fill-mask": "fp32,optimized",
                                                             "generate": "fp32,w8,w4,w4kv8", "embed": "fp32",
                                                             "g2p": "fp32", "token-classify": "fp32,optimized,int8"})
    quiet: bool = False


class Pipeline:
    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.py = sys.executable
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.published: dict[str, int] = {}
        self.board = BuildBoard(cfg.repository, cfg.workdir / "logs")
        self._building: tuple[str, str] | None = None     # (name, task) of the model being built

    def step(self, name: str, cmd: list[str], out: Path, inputs: list[Path], salt: str = "") -> Path:
        """Run `cmd` unless `out` was made by the same command from the same inputs (and salt)."""
        key = step_key(cmd, inputs, salt, self.cfg.workdir)
        if up_to_date(out, key):
            log.info("%s: up to date (%s)", name, out)
            self.skipped.append(name)
            return out
        building = self._building
        if building is None:
            run_command(cmd, name)
        else:
            model, task = building
            self.board.set(model, task, "training")
            run_command(cmd, name, self.board.log_of(model),
                        lambda: self.board.set(model, task, "training", training_progress(out)))
        if not (out / "config.json").exists() and not (out / "tokenizer.json").exists():
            raise PipelineError(f"{name} reported success but wrote nothing usable in {out}")
        stamp(out, key, name)
        self.ran.append(name)
        return out

    def train(self, command: str, args: list[str], out: Path, inputs: list[Path]) -> Path:
        """A `python -m training <command>` step. Its output also depends on the command's recipe (the settings
        not on its command line), so the recipe's digest is part of the step's key."""
        cmd = [self.py, "-m", "training", command, *args, *self._train_args(command), "--out", str(out)]
        return self.step(command, cmd, out, inputs, recipes.digest(command))

    def _train_args(self, stage: str) -> list[str]:
        args: list[str] = []
        # A classifier takes its size from the checkpoint it starts from, and so does a continued MLM.
        preset = self.cfg.preset
        if stage == "g2p" and preset != "tiny":   # g2p's presets are its own recipes (tiny, default, long)
            preset = None
        fine_tuned = stage in ("classify", "token-classify") or (stage == "mlm" and self.cfg.encoder == "minilm")
        if preset and not fine_tuned:
            args += ["--preset", preset]
        if stage in self.cfg.steps:
            args += ["--steps", str(self.cfg.steps[stage])]
        if self.cfg.threads is not None:
            args += ["--threads", str(self.cfg.threads)]
        if self.cfg.quiet:   # quiet logs, but a bar per step with its ETA (in a log: a line every 10 s)
            args += ["--quiet", "--progress", "on"]
        return args

    def _corpus_args(self) -> list[str]:
        return ["--corpus", *map(str, self.cfg.corpus)] if self.cfg.corpus else []

    def run(self) -> dict[str, int]:
        """Every model, each published as soon as it passes its gate, in the order that answers each task soonest
        (the embedding model first: nothing to train; then by training time). A model whose build fails is marked
        failed (its stage, step and log, as the server lists it) and the others go on; PipelineError at the end
        names each failure."""
        self.cfg.workdir.mkdir(parents=True, exist_ok=True)
        builds = self._builds()
        for name, task, _ in builds:
            self.board.set(name, task, "queued")
        failures = []
        for name, task, build in builds:
            self._building = (name, task)
            try:
                build()
            except PipelineError as exc:
                failures.append(f"{name}: {exc}")
                self.board.set(name, task, "failed", error=str(exc))
                log.error("%s: build failed: %s", name, exc)
            finally:
                self._building = None
        if self.cfg.server is not None and self.published:
            load_into_server(self.cfg.server, self.published)
        if failures:
            raise PipelineError(f"{len(failures)} of {len(builds)} models failed (the others are published): "
                                + "; ".join(failures))
        return self.published

    def _builds(self) -> list[tuple[str, str, Callable[[], object]]]:
        """(published name, task, build) in build order: embed, fill-mask, generate, punctuate, classify, g2p
        (bench/FINDINGS.md, "First answers": their training times, shortest first)."""
        cfg, names = self.cfg, self.cfg.names
        builds: list[tuple[str, str, Callable[[], object]]] = []
        if cfg.embed_checkpoint is not None:  # a pretrained encoder as it is: nothing to train
            builds.append((names["embed"], "embed", lambda: self.publish("embed", cfg.embed_checkpoint)))
        builds.append((names["fill-mask"], "fill-mask", lambda: self.publish("fill-mask", self._mlm())))
        builds.append((names["generate"], "generate", lambda: self.publish("generate", self._lm())))
        if cfg.punctuate:
            builds.append((names["token-classify"], "token-classify", lambda: self.run_punctuate(self._init())))
        builds.append((names["classify"], "classify", lambda: self.publish("classify", self._classifier())))
        if cfg.g2p:
            builds.append((names["g2p"], "generate", self.run_g2p))
        return builds

    def _init(self) -> Path:
        """What the classifier and the punctuation restorer are fine-tuned from: MiniLM, or the scratch MLM."""
        if self.cfg.encoder == "minilm":
            if self.cfg.minilm is None:
                raise PipelineError("encoder minilm: the MiniLM checkpoint directory is not known")
            return self.cfg.minilm
        return self._mlm()

    def _mlm(self) -> Path:
        cfg, w = self.cfg, self.cfg.workdir
        if cfg.encoder == "minilm":
            # MLM continued from MiniLM with its own tokenizer: no WordPiece tokenizer to train.
            minilm = self._init()
            return self.train("mlm", ["--init", str(minilm), *self._corpus_args()], w / "checkpoints/mlm",
                              [minilm, *cfg.corpus])
        wp = self.step("tokenizer-wordpiece",
                       [self.py, "-m", "training", "tokenizer", "--kind", "wordpiece", *self._corpus_args(),
                        "--out", str(w / "tokenizers/wordpiece")], w / "tokenizers/wordpiece", list(cfg.corpus))
        return self.train("mlm", ["--tokenizer", str(wp), *self._corpus_args()], w / "checkpoints/mlm",
                          [wp, *cfg.corpus])

    def _lm(self) -> Path:
        cfg, w = self.cfg, self.cfg.workdir
        bpe = self.step("tokenizer-bpe",
                        [self.py, "-m", "training", "tokenizer", "--kind", "bpe", *self._corpus_args(),
                         "--out", str(w / "tokenizers/bpe")], w / "tokenizers/bpe", list(cfg.corpus))
        return self.train("lm", ["--tokenizer", str(bpe), *self._corpus_args()], w / "checkpoints/lm",
                          [bpe, *cfg.corpus])

    def _classifier(self) -> Path:
        cfg = self.cfg
        init = cfg.classify_init or self._init()
        data_args: list[str] = []
        for flag, path in zip(("--train", "--validation", "--test"), cfg.classify_data):
            data_args += [flag, str(path)]
        return self.train("classify", ["--init", str(init), *data_args], cfg.workdir / "checkpoints/classifier",
                          [init, *cfg.classify_data])

    def run_g2p(self) -> Path:
        """Train the grapheme-to-phoneme encoder-decoder on CMUdict and publish it (an exported seq2seq package)."""
        ckpt = self.train("g2p", [], self.cfg.workdir / "checkpoints/g2p", [])
        self.publish("g2p", ckpt, task="generate")
        return ckpt

    def run_punctuate(self, init: Path) -> Path:
        """Fine-tune `init` (MiniLM, or the scratch MLM) as the punctuation and casing restorer and publish it."""
        ckpt = self.train("token-classify", ["--init", str(init)], self.cfg.workdir / "checkpoints/token-classifier",
                          [init])
        self.publish("token-classify", ckpt)
        return ckpt

    def publish(self, stage: str, ckpt: Path, task: str | None = None) -> None:
        """Publish a stage's checkpoint under the stage's name; `task` when the export task differs from the stage
        (g2p is exported as a generation model)."""
        name = self.cfg.names[stage]
        options = ("--matryoshka",) if stage == "embed" and self.cfg.embed_matryoshka else ()
        self.board.set(name, task or stage, "exporting")
        version = publish(self.cfg.repository, name, task or stage, ckpt, self.cfg.variants[stage], options,
                          self.board.log_of(name))
        self.board.done(name)
        if version is None:
            self.skipped.append(f"publish-{name}")
            return
        self.published[name] = version
        self.ran.append(f"publish-{name}")
