"""Texts to be truncated are cut to a short prefix before they are tokenized, where the cut provably changes nothing.

With truncation a text keeps at most max_length tokens, yet the tokenizers library tokenizes all of it first (and
keeps the rest as `overflowing` encodings): a rerank of many long documents tokenized all of every one, for the
first max_length tokens of each (issue 40, kind 6; docs/RELIABILITY.md has the figures). Here a long text is first cut at a
whitespace near `max_length * GUESS_CHARS_PER_TOKEN` characters, the cut prefix is tokenized, and the cut is kept
only when the result cannot differ from the whole text's:

- the cut falls before a whitespace, so every word of the prefix is whole (pre-tokenizers split at whitespace:
  BERT's, Metaspace, byte-level BPE's, whose space belongs to the next word), and the prefix's tokens are the
  first tokens of the whole text;
- the prefix alone still holds at least max_length tokens, so truncation keeps only tokens of the prefix; and for a
  pair (cut longest first, or the first text only) the cut side is also at least as long as the other side, so the
  truncation splits the budget between the two sides exactly as it would for the whole text.

A text that fails (no whitespace, or a prefix too short at every guess) is left whole: the tokenizer then does what it
did before, only slower. Pairs whose two texts are both long are left whole too (which side is longer decides who
keeps the odd token, and the cut could change it).
"""
from __future__ import annotations

from typing import Sequence

from tokenizers import Encoding, Tokenizer

# Characters per token to try; real vocabularies average a few characters per token, a tiny one fewer: the first
# guess serves most text, the second most of the rest.
GUESS_CHARS_PER_TOKEN = (8, 32)

Item = str | tuple[str, str]


def _cut_at_space(text: str, limit: int) -> str | None:
    """The text up to the last whitespace at or before `limit`, that whitespace run excluded; None if none."""
    if len(text) <= limit:
        return None
    space = max(text.rfind(" ", 0, limit + 1), text.rfind("\n", 0, limit + 1), text.rfind("\t", 0, limit + 1))
    if space <= 0:
        return None
    cut = text[:space].rstrip()
    return cut or None


def _side_tokens(encoding: Encoding, side: int) -> int:
    return sum(1 for s in encoding.sequence_ids if s == side)


def _trial(item: Item, limit: int, first_only: bool) -> tuple[Item, int] | None:
    """The item with its one long side cut, and which side (0 or 1); None when no cut applies."""
    if isinstance(item, str):
        cut = _cut_at_space(item, limit)
        return None if cut is None else (cut, 0)
    first, second = item
    cuts = [_cut_at_space(first, limit), None if first_only else _cut_at_space(second, limit)]
    if cuts[0] is not None and cuts[1] is None and len(second) <= limit:
        return (cuts[0], second), 0
    if cuts[1] is not None and cuts[0] is None and len(first) <= limit:
        return (first, cuts[1]), 1
    return None   # nothing long, or both sides long


def shorten(tokenizer: Tokenizer, batch: Sequence[Item], max_length: int, first_only: bool = False) -> list[Item]:
    """The batch with each long text cut where truncation to max_length gives the same tokens (module docstring).
    `tokenizer` must not truncate (the prefix's own length is what is checked)."""
    out = list(batch)
    pending = list(range(len(out)))
    for chars_per_token in GUESS_CHARS_PER_TOKEN:
        limit = max_length * chars_per_token
        trials = {i: t for i in pending if (t := _trial(out[i], limit, first_only)) is not None}
        if not trials:
            break
        order = list(trials)
        encodings = tokenizer.encode_batch([trials[i][0] for i in order])
        pending = []
        for i, encoding in zip(order, encodings):
            item, side = trials[i]
            kept = _side_tokens(encoding, side)
            other = _side_tokens(encoding, 1 - side) if isinstance(item, tuple) else 0
            if kept >= max_length and kept >= other:
                out[i] = item
            else:
                pending.append(i)
    return out


__all__ = ["GUESS_CHARS_PER_TOKEN", "shorten"]
