"""Fixtures the reliability tests share (besides tests/conftest.py's session fixtures)."""
from __future__ import annotations

from pathlib import Path

import pytest

SEQ2SEQ = "marian"


@pytest.fixture(scope="session")
def seq2seq_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Marian encoder-decoder exported once (testing/seq2seq_checkpoints.py): the model folder to
    copy into a fuzz server's repository as SEQ2SEQ. READ-ONLY."""
    from testing.seq2seq_checkpoints import export_repository

    return export_repository(tmp_path_factory.mktemp("reliability-seq2seq"), (SEQ2SEQ,))[SEQ2SEQ].parent
