"""Tokenize and detokenize for every model kind: a text's tokens with their ids, strings, special-token marks and
character offsets into the text (what /tokenize and the task API's Tokenize answer), and token ids back to text.

The served models call these with their own tokenizer (an encoder's, a decoder's prompt tokenizer, an
encoder-decoder's source tokenizer); bounds are checked before any tokenizing or decoding (a request may hold
megabytes of text or millions of ids).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from tokenizers import Encoding, Tokenizer

from protos.results import TokenSpan   # the client's too (protos/results.py)
from server.protocol.errors import ServingError

# No token covers more characters than this (tokenization.CHARS_PER_TOKEN_BOUND): a text longer than
# (max_length + 1) x this can never fit a model and is refused before it is tokenized.
CHARS_PER_TOKEN = 100


@dataclass(frozen=True)
class Tokenized:
    model: str
    version: int
    tokens: list[TokenSpan]
    max_length: int          # the model's context (max_model_len): how many of these tokens it can take

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]


def check_text_bound(text: str, max_length: int, field: str) -> None:
    """INVALID_ARGUMENT naming `field` for a text no model of this context could take (checked before tokenizing)."""
    limit = (max_length + 1) * CHARS_PER_TOKEN
    if len(text) > limit:
        raise ServingError.invalid(field, f"{len(text)} characters cannot fit the model's context of {max_length} "
                                          "tokens (tokenize at most one context per request)")


def spans(encoding: Encoding, special_ids: Iterable[int]) -> list[TokenSpan]:
    """One TokenSpan per token of an encoding (offsets are characters of the text, as Python indexes them)."""
    special = set(special_ids)
    return [TokenSpan(id=i, text=t, special=bool(m) or i in special, start=a, stop=b)
            for i, t, m, (a, b) in zip(encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets)]


def encode_spans(tokenizer: Tokenizer, text: str, special_ids: Iterable[int], batched: bool) -> list[TokenSpan]:
    """The text's tokens (encode_batch releases the GIL: `batched` in a worker thread)."""
    encoding = tokenizer.encode_batch([text])[0] if batched else tokenizer.encode(text)
    return spans(encoding, special_ids)


def check_ids(token_ids: list[Any], vocab_size: int, max_length: int, field: str = "tokens") -> None:
    """INVALID_ARGUMENT naming the field for more ids than one context, or `field[i]` for an id outside the
    vocabulary (the count first: a list may hold millions)."""
    if len(token_ids) > max_length:
        raise ServingError.invalid(field, f"{len(token_ids)} ids exceed the model's context of {max_length} tokens "
                                          "(detokenize at most one context per request)")
    for i, token in enumerate(token_ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ServingError.invalid(f"{field}[{i}]", f"must be a token id, got {type(token).__name__}")
        if not 0 <= token < vocab_size:
            raise ServingError.invalid(f"{field}[{i}]", f"token id {token} is outside the vocabulary (size "
                                                        f"{vocab_size})")


def special_ids(special_tokens: dict[str, Any]) -> set[int]:
    """The ids of a manifest's special_tokens map."""
    return {v for v in special_tokens.values() if isinstance(v, int) and not isinstance(v, bool)}


__all__ = ["TokenSpan", "Tokenized", "check_ids", "check_text_bound", "encode_spans", "special_ids", "spans"]
