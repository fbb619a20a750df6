"""The training tests' session fixtures: one temporary root and the corpus of two plays cut from it."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.training_runs import PLAYS
from training.data import fetch_shakespeare, lines_to_documents, load_plays


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="session")
def corpus(root: Path) -> Path:
    d = root / "corpus"
    d.mkdir()
    lines = load_plays(fetch_shakespeare(), PLAYS)
    for p in PLAYS:
        (d / f"{p}.txt").write_text("\n\n".join(lines_to_documents(lines[p])))
    return d
