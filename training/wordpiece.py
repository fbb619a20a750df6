"""WordPiece vocabulary training that gives the same vocabulary in every process.

tokenizers' WordPieceTrainer (as of 0.23.3) is its BPE trainer with `##` continuation pieces. It numbers
those pieces in hash-map order, which changes from process to process, and breaks ties between equally frequent
merges by comparing the pieces' numbers: so the same corpus gave a different vocabulary near the vocab_size cut
in each process (huggingface/tokenizers#1794, fix proposed in PR #2066). BpeTrainer with a `##` prefix numbers
them the same way, so it is no way round. This is the same algorithm with every order fixed: specials first, then
the alphabet sorted, then the `##` pieces sorted, then one piece per merge; the most frequent pair merges first,
a tie going to the pair with the lower ids (as upstream breaks it, only now the ids are the same every time).
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable, Sequence

from tokenizers import Tokenizer

Pair = tuple[int, int]


def count_words(tok: Tokenizer, texts: Iterable[str]) -> Counter[str]:
    """How often each word occurs, the words being what `tok`'s normalizer and pre-tokenizer make of the texts
    (what tokenizers' trainers count too)."""
    counts: Counter[str] = Counter()
    for text in texts:
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        words = tok.pre_tokenizer.pre_tokenize_str(text) if tok.pre_tokenizer is not None else [(text, None)]
        counts.update(w for w, _ in words)
    return counts


def train_vocab(word_counts: Counter[str], vocab_size: int, min_frequency: int, specials: Sequence[str],
                prefix: str = "##") -> dict[str, int]:
    """A WordPiece vocabulary (token -> id) of at most `vocab_size` tokens, or fewer when no pair occurs
    `min_frequency` times more; the alphabet is always whole, as in tokenizers."""
    vocab: dict[str, int] = {}
    for token in [*specials, *sorted({c for w in word_counts for c in w}),
                  *sorted({prefix + c for w in word_counts for c in w[1:]})]:
        vocab.setdefault(token, len(vocab))
    names = list(vocab)  # id -> token
    # Words in sorted order, as lists of piece ids; a pair's count is summed over the words it occurs in.
    items = sorted(word_counts.items())
    words = [[vocab[w[0]], *(vocab[prefix + c] for c in w[1:])] for w, _ in items]
    freq = [n for _, n in items]
    pair_count: Counter[Pair] = Counter()
    where: defaultdict[Pair, set[int]] = defaultdict(set)  # pair -> words that have (or once had) it
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_count[pair] += freq[i]
            where[pair].add(i)
    # Max-heap by count, then the lower ids: a total order, so the order entries go in does not matter. An entry
    # may be stale: one whose count no longer matches is pushed again with the current count; a pair whose count
    # grows gets a new entry at once, so the entry that pops with its current count is the true maximum.
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        n = pair_count[pair]
        if n != -neg:
            if n > 0:
                heapq.heappush(heap, (-n, pair))
            continue
        if n < min_frequency:
            break
        a, b = names[pair[0]], names[pair[1]]
        token = a + b[len(prefix):] if b.startswith(prefix) else a + b
        if token not in vocab:
            vocab[token] = len(names)
            names.append(token)
        grown: set[Pair] = set()
        for i in where.pop(pair):
            old, new = words[i], _merge(words[i], pair, vocab[token])
            if new is old:
                continue
            for p in zip(old, old[1:]):
                pair_count[p] -= freq[i]
            for p in zip(new, new[1:]):
                pair_count[p] += freq[i]
                where[p].add(i)
                grown.add(p)
            words[i] = new
        for p in grown:
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return vocab


def _merge(word: list[int], pair: Pair, merged: int) -> list[int]:
    """`word` with each occurrence of `pair` replaced by `merged`, left to right; `word` itself when it has none."""
    out: list[int] = []
    i, found = 0, False
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i, found = i + 2, True
        else:
            out.append(word[i])
            i += 1
    return out if found else word
