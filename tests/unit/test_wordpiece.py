"""training/wordpiece.py on a corpus small enough to work by hand (the merges below are counted on paper);
that the vocabulary is the same in every process is tests/training/test_tokenizer_cli.py."""
from __future__ import annotations

from collections import Counter

from training.tokenizer import build_wordpiece
from training.wordpiece import count_words, train_vocab

WORDS = Counter({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5})
# [UNK], the alphabet sorted, the `##` pieces sorted, then the merges: ##u ##g (20), ##u ##n (16), h ##ug (15),
# p ##un (12), then a tie at 5 between p ##ug (ids 5, 12) and hug ##s (ids 14, 10) that the lower ids win, then
# hug ##s (5), b ##un (4).
BASE = ["[UNK]", "b", "g", "h", "n", "p", "s", "u", "##g", "##n", "##s", "##u"]
MERGED = ["##ug", "##un", "hug", "pun", "pug", "hugs", "bun"]


def test_merges_in_order_of_count_ties_to_the_lower_ids() -> None:
    vocab = train_vocab(WORDS, vocab_size=100, min_frequency=1, specials=["[UNK]"])
    assert vocab == {t: i for i, t in enumerate(BASE + MERGED)}


def test_stops_at_vocab_size_and_at_min_frequency() -> None:
    assert list(train_vocab(WORDS, vocab_size=17, min_frequency=1, specials=["[UNK]"])) == BASE + MERGED[:5]
    assert list(train_vocab(WORDS, vocab_size=100, min_frequency=5, specials=["[UNK]"])) == BASE + MERGED[:6]


def test_a_repeated_pair_merges_left_to_right() -> None:
    # "aaaa" is a ##a ##a ##a: ##a ##a (2) merges first, at the left, making a ##aa ##a (right to left would
    # make a ##a ##aa); then a tie at 1 that a ##aa (ids 0, 2) wins over ##aa ##a (2, 1); then aaa ##a.
    vocab = train_vocab(Counter({"aaaa": 1}), vocab_size=100, min_frequency=1, specials=[])
    assert list(vocab) == ["a", "##a", "##aa", "aaa", "aaaa"]


def test_words_are_what_the_bert_normalizer_and_pre_tokenizer_make() -> None:
    counts = count_words(build_wordpiece(), ["Hug, hug!", "  PUG 床前"])
    assert counts == Counter({"hug": 2, ",": 1, "!": 1, "pug": 1, "床": 1, "前": 1})
