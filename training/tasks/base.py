"""What every training task shares: the Task protocol the trainer drives, batch padding, the evaluation cap,
the pre-training corpus, and the cleaned tokenizer copy a checkpoint ships.

A task owns its data, model and loss; the loop in training/trainer.py is shared. Batches are built for
the GLOBAL batch (identical on every rank) and the loss of a rank's rows is normalised by the
global count of loss positions, so the sum over ranks is the single-process loss.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch
from torch import nn

from training import data as data_mod
from training.checkpoint import save_model
from training.tokenizer import TOKENIZER_FILES, copy_tokenizer_dir

Batch = dict[str, torch.Tensor]


class Task(Protocol):
    name: str
    kind: str                 # load_model kind of the saved checkpoint
    eval_key: str             # metric that picks the best checkpoint
    higher_is_better: bool

    def num_examples(self) -> int: ...
    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module: ...
    def make_batch(self, indices: Sequence[int], seed: int) -> Batch: ...
    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        """This rank's share of the global-batch loss (the shares sum to the global mean)."""
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None: ...
    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None: ...
    def summary(self) -> dict[str, Any]: ...


class HeldOutTask:
    """What the tasks share: training rows in `train`, held-out rows per split in `held`, scoring of a
    split, and checkpoints that ship the cleaned tokenizer copy."""

    train: list
    held: dict[str, list]
    tokenizer_copy: Path  # set by the trainer (prepare_tokenizer_copy)

    def num_examples(self) -> int:
        return len(self.train)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any] | None:
        """The split's metrics (None when it has no held-out rows), the model in eval mode, no gradients."""
        rows = self.held.get(split) or []
        if not rows:
            return None
        model.eval()
        return self.score(model, rows, device)

    def score(self, model: nn.Module, rows: list, device: torch.device) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, model: nn.Module, out_dir: Path, extra_files: dict[str, bytes]) -> None:
        save_model(model, out_dir, tokenizer_files=tokenizer_files(self.tokenizer_copy), extra_files=extra_files)


def pad_ids(seqs: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def sample_capped(items: list, n: int, seed: int) -> list:
    """A deterministic subset of at most n items (the evaluation cap), order kept."""
    if n <= 0 or len(items) <= n:
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]


def tokenizer_files(info_dir: Path) -> dict[str, Path]:
    return {name: info_dir / name for name in TOKENIZER_FILES if (info_dir / name).is_file()}


@dataclass
class CorpusSplits:
    """Documents for pre-training: train, and held-out text for evaluation."""

    train: list[str]
    validation: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    source: str = "shakespeare"


def default_corpus() -> CorpusSplits:
    # The play split is the genre task's fixed one (not the run's seed): test plays stay unseen.
    texts = data_mod.pretraining_texts(data_mod.GenreDataConfig())
    return CorpusSplits(texts["train"], texts["validation"], texts["test"], "shakespeare (held-out plays)")


def user_corpus(paths: Sequence[str], holdout: float = 0.05, seed: int = 0) -> CorpusSplits:
    """User text files; a seeded 5% of the documents is held out for evaluation."""
    docs = data_mod.read_corpus(paths)
    idx = list(range(len(docs)))
    random.Random(seed).shuffle(idx)
    n_eval = int(len(docs) * holdout) if len(docs) >= 20 else 0
    held = sorted(idx[:n_eval])
    half = len(held) // 2
    held_set = set(held)
    return CorpusSplits(
        [docs[i] for i in range(len(docs)) if i not in held_set],
        [docs[i] for i in held[:half]], [docs[i] for i in held[half:]], "user files",
    )


def prepare_tokenizer_copy(task: Any, src: str | Path, work: Path, model_max_length: int | None) -> None:
    """Give the task a cleaned copy of its tokenizer (padding/truncation off) to ship in checkpoints."""
    task.tokenizer_copy = copy_tokenizer_dir(src, work, model_max_length)
