"""A long text cut to a prefix before truncation gives exactly the tokens the whole text gives (server/text/prefix_cut.py):
ids, type ids and character offsets, for single texts and pairs, longest-first and first-only, on a WordPiece and a
byte-level BPE tokenizer; texts where no cut is safe are left whole."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from server.text.prefix_cut import shorten
from server.text.tokenizer import TextEncoder, load_tokenizer

WORDS = ("the king walked to Ravenspurgh, sadly! café Bolingbroke quarrelled with Dogberry in Messina "
         "Benedick castle x").split()
MAX_LENGTH = 48


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.conftest import family_tokenizers

    return family_tokenizers(tmp_path_factory.mktemp("prefix_cut"))


def _text(rng: random.Random, chars: int, spaces: str = " ") -> str:
    out, n = [], 0
    while n < chars:
        word = rng.choice(WORDS)
        out.append(word)
        n += len(word) + 1
    return "".join(w + rng.choice(spaces) for w in out)[:chars]


def _truncating(path: Path, strategy: str) -> Tokenizer:
    tokenizer = load_tokenizer(path)
    tokenizer.enable_truncation(MAX_LENGTH, strategy=strategy)
    return tokenizer


@pytest.mark.parametrize("kind", ["wordpiece", "roberta"])
@pytest.mark.parametrize("first_only", [False, True])
def test_cut_texts_truncate_to_the_same_tokens(tokenizers: dict[str, Path], kind: str, first_only: bool) -> None:
    rng = random.Random(7)
    path = tokenizers[kind] / "tokenizer.json"
    plain = load_tokenizer(path)
    long_texts = [_text(rng, 3000), _text(rng, 3000, " \n\t  "), _text(rng, 400), "x" * 5000]
    batch: list = [*long_texts, *[("the king", t) for t in long_texts], *[(t, "sadly") for t in long_texts],
                   (long_texts[0], long_texts[1])]
    cut = shorten(plain, batch, MAX_LENGTH, first_only)
    reference = _truncating(path, "only_first" if first_only else "longest_first")
    shortened = 0
    for whole, short in zip(batch, cut):
        if first_only and isinstance(whole, tuple) and len(whole[1]) > 100:
            continue   # only_first cannot cut a long second text: refused by the encoder, not compared
        expected = reference.encode(*whole) if isinstance(whole, tuple) else reference.encode(whole)
        got = reference.encode(*short) if isinstance(short, tuple) else reference.encode(short)
        assert (got.ids, got.type_ids, got.offsets) == (expected.ids, expected.type_ids, expected.offsets), whole
        shortened += short != whole
    assert cut[3] == "x" * 5000                   # no whitespace: left whole
    assert cut[-1] == batch[-1]                   # both sides long: left whole
    assert shortened >= 4, shortened              # the long texts with spaces were cut


def test_the_encoder_answers_the_same_tokens_with_and_without_the_cut(tokenizers: dict[str, Path]) -> None:
    rng = random.Random(3)
    texts = [(_text(rng, 5000), None) for _ in range(3)] + [("the king", _text(rng, 5000))]
    encoder = TextEncoder(tokenizers["wordpiece"] / "tokenizer.json", MAX_LENGTH)
    rows = encoder.encode(texts, truncate=True)
    reference = _truncating(tokenizers["wordpiece"] / "tokenizer.json", "longest_first")
    for (text, pair), row in zip(texts, rows):
        expected = reference.encode(text, pair) if pair else reference.encode(text)
        assert row.ids == expected.ids and row.encoding.offsets == expected.offsets
        assert len(row.encoding.overflowing) < 20   # the cut prefix, not the whole text, was tokenized
