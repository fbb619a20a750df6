"""Input processing: a prompt (text or token ids) and its parameters become checked ids that fit the context.

Runs on the event loop when a request arrives, before admission: every error is a ValueError naming the field.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from tokenizers import Tokenizer

from .params import GenerationParams
from .spec import DecoderSpec

logger = logging.getLogger(__name__)


class PromptProcessor:
    def __init__(self, spec: DecoderSpec, tokenizer: Tokenizer) -> None:
        self.spec = spec
        self.tokenizer = unpadded(tokenizer)

    def fit(self, params: GenerationParams) -> GenerationParams:
        """The parameters as served (a decoder's: as asked)."""
        return params

    def encode_many(self, jobs: Sequence[tuple[str | list[int], GenerationParams]], batched: bool = True
                    ) -> list[list[int]]:
        """`encode` of each (prompt, params), the text prompts tokenized in one batch (a text repeated, as
        OpenAI's `n` repeats it, is tokenized once). The character bound of each text is checked before any is
        tokenized. batched=False (the event loop's short prompts): one encode per text, which holds the GIL;
        encode_batch releases it, and taking it back behind the engine's thread cost the loop more than the
        tokenizing (bench/FINDINGS.md)."""
        texts = {self._bounded(p, params.truncate_prompt) for p, params in jobs if isinstance(p, str)}
        texts.discard("")
        ordered = list(texts)
        ids = dict(zip(ordered, encode_texts(self.tokenizer, ordered, batched)))
        return [self.encode(p, params, ids.get(self._bounded(p, params.truncate_prompt), [])
                            if isinstance(p, str) else None) for p, params in jobs]

    def encode(self, prompt: str | list[int], params: GenerationParams, text_ids: list[int] | None = None) -> list[int]:
        """Prompt ids that fit the context with max_new_tokens, or ValueError naming the field. text_ids: a text
        prompt's ids, when already tokenized."""
        if not isinstance(params, GenerationParams):
            raise TypeError("params must be a GenerationParams (use GenerationParams.validate)")
        for name in ("target_language", "source_language"):
            if getattr(params, name) is not None:
                raise ValueError(f"{name}: this decoder-only model has no languages (only translation "
                                 "encoder-decoders such as M2M100, NLLB or mBART take one)")
        spec = self.spec
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, params.truncate_prompt) if text_ids is None else text_ids
        elif isinstance(prompt, list):
            ids = self._token_prompt(prompt, params)
        else:
            raise ValueError(f"prompt: must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            start = spec.bos_id if spec.bos_id is not None else spec.eos_id
            if start is None:
                raise ValueError("prompt: must not be empty (the model has no bos/eos token to start from)")
            ids = [start]
        context, wanted = spec.max_length, params.max_new_tokens
        if wanted >= context:
            raise ValueError(f"parameters.max_new_tokens: must be < the model's context of {context} tokens "
                             f"(room for at least one prompt token), got {wanted}")
        room = context - wanted
        if len(ids) > room:
            if not params.truncate_prompt:
                raise ValueError(f"prompt: {len(ids)} tokens + parameters.max_new_tokens {wanted} exceed the model's "
                                 f"context of {context} tokens (shorten it, lower max_new_tokens, or set truncate_prompt)")
            ids = ids[-room:]
        check_params_vocab(params, spec.vocab_size)
        return ids

    def tokenize(self, text: str, truncate: bool = False, batched: bool = False) -> list[int]:
        """The ids of a text prompt, as generation makes them (before fitting them to the context).

        The last `context` tokens of a text lie within its last (context + 1) * 100 characters (no token covers
        more), so a longer text is refused (or, with `truncate`, cut) before tokenizing: tokenizing megabytes
        would hold the event loop for seconds."""
        text = self._bounded(text, truncate)
        if not text:
            return []
        # (encode_batch releases the GIL while it works, encode holds it: a worker thread calls the former)
        return list((self.tokenizer.encode_batch([text])[0] if batched else self.tokenizer.encode(text)).ids)

    def _bounded(self, text: str, truncate: bool) -> str:
        """The text, or (truncate) its tail that can hold the last `context` tokens; ValueError when it is longer
        than any prompt that can fit."""
        max_chars = (self.spec.max_length + 1) * 100
        if len(text) > max_chars:
            if not truncate:
                raise ValueError(f"prompt: {len(text)} characters cannot fit the model's context of "
                                 f"{self.spec.max_length} tokens (shorten it, or set truncate_prompt)")
            text = text[-max_chars:]
        return text

    def detokenize(self, token_ids: list[int], batched: bool = False) -> str:
        """The text of token ids, each checked against the vocabulary (ValueError naming `tokens[i]`)."""
        check_token_ids(token_ids, self.spec.vocab_size, "tokens")
        if batched:   # (decode_batch releases the GIL while it works, decode holds it)
            return self.tokenizer.decode_batch([token_ids], skip_special_tokens=False)[0]
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of an admitted token-id prompt."""
        return self.detokenize(token_ids)

    def _token_prompt(self, prompt: list[int], params: GenerationParams) -> list[int]:
        vocab, context = self.spec.vocab_size, self.spec.max_length
        first = 0
        if len(prompt) > context:      # only the tail that can fit is checked (the list may be huge)
            if not params.truncate_prompt:
                raise ValueError(f"prompt: {len(prompt)} tokens cannot fit the model's context of {context} tokens "
                                 "(shorten it, or set truncate_prompt)")
            first = len(prompt) - context
        check_token_ids(prompt[first:], vocab, "prompt", first)
        return list(prompt[first:])


def check_params_vocab(params: GenerationParams, vocab: int) -> None:
    """ValueError naming the first token id of the parameters outside the (generated) vocabulary."""
    for i, token in enumerate(params.stop_token_ids):
        if token >= vocab:
            raise ValueError(f"parameters.stop_token_ids[{i}]: {token} is outside the vocabulary (size {vocab})")
    for token, _ in params.logit_bias:
        if token >= vocab:
            raise ValueError(f"parameters.logit_bias: token {token} is outside the vocabulary (size {vocab})")


def unpadded(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer itself, or a copy without padding/truncation (they would corrupt prompt ids)."""
    if tokenizer.padding is None and tokenizer.truncation is None:
        return tokenizer
    logger.info("generation: using a copy of the tokenizer with padding and truncation turned off")
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def check_token_ids(ids: list[Any], vocab: int, name: str, offset: int = 0) -> None:
    """ValueError naming `name[i]` for the first entry that is not a token id of the vocabulary."""
    for i, token in enumerate(ids, start=offset):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"{name}[{i}]: must be a token id, got {type(token).__name__}")
        if not 0 <= token < vocab:
            raise ValueError(f"{name}[{i}]: token id {token} is outside the vocabulary (size {vocab})")


def encode_texts(tokenizer: Tokenizer, texts: list[str], batched: bool) -> list[list[int]]:
    """Each text's ids: one encode_batch call (it releases the GIL: for worker threads), or one encode per text."""
    if not texts:
        return []
    encodings = tokenizer.encode_batch(texts) if batched else [tokenizer.encode(t) for t in texts]
    return [list(e.ids) for e in encodings]
