"""server/encoders/token_aggregation.py on hand-made token rows: every strategy's grouping, offsets and scores worked out
by hand (the served answers are compared with transformers' pipeline in tests/training/test_token_classification.py)."""
from __future__ import annotations

import numpy as np
import pytest

from server.protocol.errors import ServingError
from server.encoders.token_aggregation import TokenRow, aggregate, as_pipeline_dict, check_strategy, softmax

LABELS = ["O", "B-PER", "I-PER", "B-LOC"]
TEXT = "Jonathan lives in Lon don"
# [CLS] Jon ##athan lives in Lon don [SEP]: a WordPiece-style row (word-aware: "##athan" is longer than "athan").
ROW = TokenRow(TEXT, ids=[1, 10, 11, 12, 13, 14, 15, 2],
               tokens=["[CLS]", "Jon", "##athan", "lives", "in", "Lon", "don", "[SEP]"],
               offsets=[(0, 0), (0, 3), (3, 8), (9, 14), (15, 17), (18, 21), (22, 25), (0, 0)],
               special=[1, 0, 0, 0, 0, 0, 0, 1])


def _logits(best: list[int], margin: list[float]) -> np.ndarray:
    """Per token, label `best` ahead of the others by `margin` (softmax score e^m / (e^m + 3))."""
    out = np.zeros((len(best), len(LABELS)), dtype=np.float32)
    for i, (b, m) in enumerate(zip(best, margin)):
        out[i, b] = m
    return out


def _p(m: float) -> float:
    return float(np.exp(m) / (np.exp(m) + 3))


# Jon: B-PER (2); ##athan: B-LOC (3, stronger); lives, in: O; Lon: B-LOC (1); don: I-PER (0.5)
LOGITS = _logits([0, 1, 3, 0, 0, 3, 2, 0], [5, 2, 3, 4, 4, 1, 0.5, 5])


def _join(tokens: list[str]) -> str:   # WordPiece's decoder, enough for these tokens
    return " ".join(tokens).replace(" ##", "")


def run(strategy: str, ignore=("O",), word_aware: bool = True, row: TokenRow = ROW, logits=LOGITS):
    return [(e.label, round(e.score, 6), e.word, e.start, e.end, e.index)
            for e in aggregate(row, logits, LABELS, strategy, _join, word_aware, 99, ignore)]


def test_none_lists_every_token_with_its_position() -> None:
    assert run("none") == [("B-PER", round(_p(2), 6), "Jon", 0, 3, 1), ("B-LOC", round(_p(3), 6), "##athan", 3, 8, 2),
                           ("B-LOC", round(_p(1), 6), "Lon", 18, 21, 5), ("I-PER", round(_p(0.5), 6), "don", 22, 25, 6)]
    assert len(run("none", ignore=())) == 6   # special tokens never appear


def test_simple_groups_same_tags_unless_a_new_b() -> None:
    # Jon (B-PER) then ##athan (B-LOC): two groups; Lon (B-LOC) then don (I-PER): two groups. A group that
    # starts mid-word keeps its prefix (WordPiece's decoder strips "##" only after a first token).
    assert run("simple") == [("PER", round(_p(2), 6), "Jon", 0, 3, None), ("LOC", round(_p(3), 6), "##athan", 3, 8, None),
                             ("LOC", round(_p(1), 6), "Lon", 18, 21, None), ("PER", round(_p(0.5), 6), "don", 22, 25, None)]


def test_first_takes_the_first_sub_token() -> None:
    # Words: Jonathan (first: B-PER, score p(2)), lives, in, Lon, don ("don" starts a word: not ##).
    assert run("first") == [("PER", round(_p(2), 6), "Jonathan", 0, 8, None), ("LOC", round(_p(1), 6), "Lon", 18, 21, None),
                            ("PER", round(_p(0.5), 6), "don", 22, 25, None)]


def test_max_takes_the_most_confident_sub_token() -> None:
    assert run("max")[0] == ("LOC", round(_p(3), 6), "Jonathan", 0, 8, None)


def test_average_takes_the_best_mean_score() -> None:
    s = softmax(LOGITS[1:3]).mean(axis=0)
    best = int(s.argmax())
    assert LABELS[best] == "B-LOC"   # p(3)/2 + small > p(2)/2 + small
    assert run("average")[0] == ("LOC", round(float(s[best]), 6), "Jonathan", 0, 8, None)


def test_i_tags_continue_a_group_and_scores_average() -> None:
    logits = _logits([0, 1, 2, 0, 0, 3, 0, 0], [5, 2, 4, 4, 4, 1, 4, 5])
    got = run("simple", logits=logits)
    assert got[0] == ("PER", round((_p(2) + _p(4)) / 2, 6), "Jonathan", 0, 8, None)


def test_ignore_labels_and_keeping_all() -> None:
    tags = [e[0] for e in run("first", ignore=())]
    assert tags == ["PER", "O", "LOC", "PER"]   # "lives in" is one O group (tag O, no B-)
    assert [e[0] for e in run("first", ignore=("O", "PER"))] == ["LOC"]


def test_without_a_subword_prefix_a_token_glued_to_the_previous_one_continues_its_word() -> None:
    # Byte-level BPE style: no "##"; "athan" starts right after "Jon" (no space), "don" after a space.
    row = TokenRow(TEXT, ROW.ids, ["<s>", "Jon", "athan", "Ġlives", "Ġin", "ĠLon", "Ġdon", "</s>"], ROW.offsets,
                   ROW.special)
    got = run("first", word_aware=False, row=row)
    assert [(e[3], e[4]) for e in got] == [(0, 8), (18, 21), (22, 25)]


def test_unknown_token_is_a_word_of_its_own_text() -> None:
    row = TokenRow("Jonathan Zz", [1, 10, 11, 99, 2], ["[CLS]", "Jon", "##athan", "[UNK]", "[SEP]"],
                   [(0, 0), (0, 3), (3, 8), (9, 11), (0, 0)], [1, 0, 0, 0, 1])
    logits = _logits([0, 1, 1, 3, 0], [5, 2, 2, 3, 5])
    assert run("none", row=row, logits=logits)[-1][2] == "Zz"
    assert run("first", row=row, logits=logits)[-1][2:5] == ("Zz", 9, 11)


def test_pipeline_keys() -> None:
    e = aggregate(ROW, LOGITS, LABELS, "none", _join, True, None)[0]
    assert set(as_pipeline_dict(e, "none")) == {"entity", "score", "index", "word", "start", "end"}
    assert set(as_pipeline_dict(e, "simple")) == {"entity_group", "score", "word", "start", "end"}


@pytest.mark.parametrize("bad", ["mean", "FIRST ", "x" * 100])
def test_unknown_strategy_names_the_field(bad: str) -> None:
    with pytest.raises(ServingError, match="aggregation_strategy: must be one of none, simple, first, average, max"):
        check_strategy(bad)
    assert check_strategy("") == "none" and check_strategy("Average") == "average"


def test_restore_text_applies_casing_and_marks_at_the_offsets() -> None:
    from clients.punctuation import restore_text
    from clients.types import TokenEntity

    text = "what my young master  o my gentle master"
    ents = [TokenEntity("Cap+COMMA", 0.9, "what", 0, 4), TokenEntity("QUESTION", 0.8, "master", 14, 20),
            TokenEntity("Cap", 0.7, "o", 22, 23), TokenEntity("EXCLAIM", 0.9, "master", 34, 40)]
    assert restore_text(text, ents) == "What, my young master?  O my gentle master!"
    assert restore_text(text, []) == text
