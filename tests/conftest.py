"""Shared session fixtures (export engineer). Treat everything they return as READ-ONLY; copy it
(`shutil.copytree`) before changing anything.

tiny_checkpoints -> TinyCheckpoints (attributes, or `tiny_checkpoints["classifier"]`):
    classifier  BertForSequenceClassification, preset "tiny" (2 layers, hidden 64), labels
                ["alpha", "beta", "gamma"], trained ~60 steps on a synthetic keyword task (accuracy ~1.0)
    mlm         BertForMaskedLM, preset "tiny", random init          (WordPiece tokenizer, vocab ~400)
    gpt         GPT2LMHeadModel, preset "tiny", random init, n_positions 128 (byte-level BPE, <|endoftext|>)
    eval_data   JSONL held-out labelled examples ({"text", "label"}) for the classifier
    All are HF-layout checkpoint directories written by training.checkpoint.save_model with real tokenizers
    trained (training.tokenizer) in well under a second on a synthetic corpus. Built in ~3 s.

tiny_repository -> Path of a model repository built through the real export API (export_checkpoint, parity
    gate included), version 1 of each:
    tiny-classifier/1   classify,  variants fp32 + int8 (int8 is the manifest's default CPU variant)
    tiny-fill-mask/1    fill-mask, variant fp32, mask token "[MASK]"
    tiny-gpt/1          generate,  variant fp32, cache {num_layers 2, num_heads 2, head_dim 32}
    Built in ~10 s on 2 cores.
"""
from __future__ import annotations

import contextlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.levels import level_of

TINY_LABELS = ["alpha", "beta", "gamma"]
# Each label owns a group of keywords; a sentence's label is the group its keywords come from.
_KEYWORDS = {
    "alpha": "river boat harbour sail anchor wave tide shore fish island".split(),
    "beta": "castle crown king throne sword battle soldier banner siege court".split(),
    "gamma": "garden rose flower tree seed leaf blossom meadow orchard spring".split(),
}
_FILLER = ("the a an of and to in on with by from at was is were be his her their our my your this that "
           "old new small great long dark bright quiet loud early late came went saw said gave took made "
           "found kept left stood walked ran asked told").split()


@dataclass(frozen=True)
class TinyCheckpoints:
    classifier: Path
    mlm: Path
    gpt: Path
    eval_data: Path

    def __getitem__(self, key: str) -> Path:
        return getattr(self, key)


def synthetic_sentence(rng: random.Random, label: str) -> str:
    words = rng.choices(_FILLER, k=rng.randint(5, 10)) + rng.choices(_KEYWORDS[label], k=rng.randint(2, 3))
    rng.shuffle(words)
    return " ".join(words).capitalize() + rng.choice([".", "!", "?", ";"])


def synthetic_examples(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(synthetic_sentence(rng, TINY_LABELS[i % 3]), i % 3) for i in range(n)]


def tiny_corpus() -> list[str]:
    from export.heldout import BUILTIN_TEXTS

    return [t for t, _ in synthetic_examples(600, seed=1)] + list(BUILTIN_TEXTS)


def family_tokenizers(root: Path) -> dict[str, Path]:
    """Byte-level BPE with RoBERTa's specials ("roberta") and WordPiece ("wordpiece") trained on the tiny corpus
    (vocab 400, max length 62), saved under `root`: the tokenizers of the transformers-saved family checkpoints."""
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    corpus = tiny_corpus()
    return {kind: save_tokenizer(train_tokenizer(corpus, TokenizerConfig(kind=kind, vocab_size=400, min_frequency=1)),
                                 root / f"tok-{kind}", kind, 62)
            for kind in ("roberta", "wordpiece")}


def _train_classifier(model, tokenizer, steps: int = 60) -> None:
    """A few Adam steps so logits have real margins (int8 top-1 agreement is meaningless on a random head)."""
    import torch

    torch.manual_seed(0)
    data = synthetic_examples(512, seed=2)
    pad = tokenizer.token_to_id("[PAD]")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        batch = data[(step * 32) % len(data):][:32]
        encs = [tokenizer.encode(t) for t, _ in batch]
        n = max(len(e.ids) for e in encs)
        ids = torch.tensor([e.ids + [pad] * (n - len(e.ids)) for e in encs])
        mask = (ids != pad).long()
        loss = torch.nn.functional.cross_entropy(model(ids, mask, torch.zeros_like(ids)),
                                                 torch.tensor([y for _, y in batch]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@contextlib.contextmanager
def one_torch_thread():
    """Tiny models on 2 shared cores: a second torch thread only adds wake-up latency (measured 24 s vs 2 s
    for the classifier's training steps under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoints:
    root = tmp_path_factory.mktemp("tiny_checkpoints")
    with one_torch_thread():
        return _build_tiny_checkpoints(root)


def _build_tiny_checkpoints(root: Path) -> TinyCheckpoints:
    import torch

    from training.bert import BertConfig, BertForMaskedLM, BertForSequenceClassification
    from training.checkpoint import save_model
    from training.gpt import GPT2LMHeadModel, GPTConfig
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    corpus = tiny_corpus()
    wp = train_tokenizer(corpus, TokenizerConfig(kind="wordpiece", vocab_size=400, min_frequency=1))
    bpe = train_tokenizer(corpus, TokenizerConfig(kind="bpe", vocab_size=400, min_frequency=1))
    wp_dir = save_tokenizer(wp, root / "tok-wordpiece", "wordpiece", 128)
    bpe_dir = save_tokenizer(bpe, root / "tok-bpe", "bpe", 128)

    def files(d: Path) -> dict[str, Path]:
        return {p.name: p for p in d.iterdir() if p.is_file()}

    torch.manual_seed(0)
    id2label = dict(enumerate(TINY_LABELS))
    clf = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=wp.get_vocab_size(), id2label=id2label))
    _train_classifier(clf, wp)
    save_model(clf, root / "classifier", tokenizer_files=files(wp_dir))
    mlm = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=wp.get_vocab_size()))
    save_model(mlm.eval(), root / "mlm", tokenizer_files=files(wp_dir))
    eot = bpe.token_to_id("<|endoftext|>")
    gpt = GPT2LMHeadModel(GPTConfig.preset("tiny", vocab_size=bpe.get_vocab_size(), bos_token_id=eot,
                                           eos_token_id=eot))
    save_model(gpt.eval(), root / "gpt", tokenizer_files=files(bpe_dir))

    eval_data = root / "classifier-eval.jsonl"
    eval_data.write_text("".join(json.dumps({"text": t, "label": TINY_LABELS[y]}) + "\n"
                                 for t, y in synthetic_examples(90, seed=3)))
    return TinyCheckpoints(root / "classifier", root / "mlm", root / "gpt", eval_data)


@pytest.fixture(scope="session")
def tiny_repository(tiny_checkpoints: TinyCheckpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tiny_repository")
    with one_torch_thread():
        _build_tiny_repository(tiny_checkpoints, repo)
    return repo


def _build_tiny_repository(tiny_checkpoints: TinyCheckpoints, repo: Path) -> None:
    from export import ExportConfig, export_checkpoint

    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.classifier, task="classify", repository=repo,
                                   name="tiny-classifier", variants=("fp32", "int8"),
                                   eval_data=tiny_checkpoints.eval_data))
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="fill-mask", repository=repo,
                                   name="tiny-fill-mask"))
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo,
                                   name="tiny-gpt"))


# ---------------------------------------------------------------- markers by folder
# Every test gets the marker of its level, from its folder under tests/ (tests/levels.py; registered in
# pyproject.toml): `pytest -m unit` runs the fast in-process tier alone (`pytest tests/unit` also skips importing
# the other folders); `-m "not slow"` (scripts/test.sh) still runs everything.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        level = level_of(item.path)
        if level:
            item.add_marker(level)


# ---------------------------------------------------------------- one torch thread in the test process
# The test process's own torch work (references, tiny trainings, exports in fixtures) is on tiny models: on the
# 2 shared cores, where server processes and other runs compete, a second intra-op thread only waits for a core
# (tests/export/test_llama_family_rope.py and tests/training/test_models.py ran several times slower with torch's
# default of one thread per core). Set before every test, as torch may be imported first by a test or a fixture;
# subprocesses keep their own settings (their command lines say --threads where they train).


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
