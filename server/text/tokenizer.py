"""Text -> token ids for encoder models, with the package's own tokenizer.json (`tokenizers`, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer

from server.protocol.errors import ServingError
from server.text.prefix_cut import shorten


def load_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer that neither pads nor truncates (padding is the batcher's job, per batch)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


# A token never covers more characters than this (WordPiece's max_input_chars_per_word is 100; a byte-level BPE
# token is a few bytes), so the first max_length tokens of a text lie within its first max_length * this
# characters. Texts beyond that are refused (or cut, with truncation) BEFORE tokenizing: tokenizing a multi-MB
# text would hold the event loop for seconds.
CHARS_PER_TOKEN_BOUND = 100
# Characters of one request's texts above which the encoder tokenizes them in a worker thread (below: a short
# stay on the event loop), and texts from which encode_batch's own worker threads pay (TextEncoder._encode_all;
# bench/FINDINGS.md).
INLINE_TEXT_CHARS = 16_384
PARALLEL_FROM = 32


@dataclass(frozen=True)
class EncodedText:
    ids: list[int]
    type_ids: list[int]
    # The tokenizer's Encoding (tokens, character offsets, special tokens): what token classification answers with.
    encoding: Encoding | None = field(default=None, compare=False, repr=False)


class TextEncoder:
    """Encodes a request's texts (or text pairs) and enforces the model's max_length."""

    def __init__(self, tokenizer_path: Path, max_length: int) -> None:
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.max_length = max_length
        # A second instance for truncating requests: truncation is a tokenizer-wide setting and the
        # plain instance is shared by concurrent requests.
        self._truncating = load_tokenizer(tokenizer_path)
        self._truncating.enable_truncation(max_length, strategy="longest_first")
        self._path = tokenizer_path
        self._first_only: Tokenizer | None = None   # made on first use: only zero-shot pairs cut the first text only

    @staticmethod
    def _encode_all(tokenizer: Tokenizer, batch: list[str | tuple[str, str]]) -> list[Encoding]:
        """encode_batch spreads a batch over the tokenizers library's worker threads; for a few short texts waking
        them costs more than the work, most of all while onnxruntime's threads spin on the same cores
        (bench/FINDINGS.md). Much text still goes to encode_batch, which releases the GIL (encode holds it: a
        worker thread's long encode would stall the event loop)."""
        if len(batch) >= PARALLEL_FROM or sum(len(b) if isinstance(b, str) else len(b[0]) + len(b[1])
                                              for b in batch) > INLINE_TEXT_CHARS:
            return tokenizer.encode_batch(batch)
        return [tokenizer.encode(*b) if isinstance(b, tuple) else tokenizer.encode(b) for b in batch]

    def _cutting_first(self) -> Tokenizer:
        if self._first_only is None:
            tokenizer = load_tokenizer(self._path)
            tokenizer.enable_truncation(self.max_length, strategy="only_first")
            self._first_only = tokenizer
        return self._first_only

    def _truncated(self, batch: list[str | tuple[str, str]], field: str, indices: list[int],
                   first_only: bool) -> list[Encoding]:
        """The inputs at `indices` cut to max_length: the longest side first, or (first_only, transformers'
        "only_first") the first text alone; a pair whose second text alone is too long is refused naming it."""
        if not first_only:
            return self._encode_all(self._truncating, [batch[i] for i in indices])
        out = []
        for i in indices:
            try:
                out.append(self._cutting_first().encode(*batch[i]) if isinstance(batch[i], tuple)
                           else self._cutting_first().encode(batch[i]))
            except Exception:   # tokenizers: "Sequence to truncate too short to respect the provided max_length"
                raise ServingError.invalid(f"{field}[{i}].text_pair", f"does not leave room for the text within the "
                                                                      f"model's max_length {self.max_length}") from None
        return out

    def encode(self, inputs: list[tuple[str, str | None]], truncate: bool = False,
               field: str = "inputs", text_attr: str = ".text", first_only: bool = False) -> list[EncodedText]:
        """One EncodedText per input; INVALID_ARGUMENT naming `field[i]` on empty or too long texts. first_only:
        truncation cuts a pair's first text only (transformers' "only_first"), else the longest side first."""
        if not inputs:
            raise ServingError.invalid(field, "at least one input is required")
        batch: list[str | tuple[str, str]] = []
        max_chars = self.max_length * CHARS_PER_TOKEN_BOUND
        for i, (text, pair) in enumerate(inputs):
            if not text or not text.strip():
                raise ServingError.invalid(f"{field}[{i}]{text_attr}", "must not be empty")
            if pair is not None and not pair.strip():
                pair = None  # an empty text_pair means "no pair" (proto3 cannot tell unset from "")
            for name, value in ((text_attr, text), (".text_pair", pair)):
                if value is not None and len(value) > max_chars and not truncate:
                    raise ServingError.invalid(
                        f"{field}[{i}]{name}", f"{len(value)} characters cannot fit the model's max_length "
                        f"{self.max_length} (ask for truncation to cut it)")
            if truncate:
                text = text[:max_chars]
                pair = None if pair is None else pair[:max_chars]
            batch.append(text if pair is None else (text, pair))
        if truncate:   # long texts cut first to a prefix that truncates to the same tokens (prefix_cut.py)
            batch = shorten(self.tokenizer, batch, self.max_length, first_only)
        encodings: list[Encoding] = self._encode_all(self.tokenizer, batch)
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > self.max_length]
        if too_long and not truncate:
            i = too_long[0]
            raise ServingError.invalid(
                f"{field}[{i}]",
                f"{len(encodings[i].ids)} tokens exceed the model's max_length {self.max_length} "
                "(ask for truncation to cut it)")
        if too_long:
            redone = self._truncated(batch, field, too_long, first_only)
            for i, e in zip(too_long, redone):
                encodings[i] = e
        return [EncodedText(ids=list(e.ids), type_ids=list(e.type_ids), encoding=e) for e in encodings]


def pad_batch(rows: list[EncodedText], pad_id: int,
              inputs: Sequence[str] = ("input_ids", "attention_mask", "token_type_ids")) -> dict[str, np.ndarray]:
    """Right-pads rows to the batch's own longest sequence: the encoder graph inputs the manifest declares
    (`inputs`; RoBERTa / DistilBERT packages declare no token_type_ids)."""
    width = max(len(r.ids) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    types = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        n = len(r.ids)
        ids[i, :n] = r.ids
        mask[i, :n] = 1
        types[i, :n] = r.type_ids
    built = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    unknown = [name for name in inputs if name not in built]
    if unknown:
        raise ServingError.invalid("model", f"encoder input {unknown[0]!r} cannot be built from text "
                                            f"(text inputs: {', '.join(built)})")
    return {name: built[name] for name in inputs}
