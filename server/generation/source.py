"""Input processing of an encoder-decoder request: the prompt is the SOURCE (text or source-vocabulary ids), checked
against max_source_length before anything is computed; the decoder's own prompt is its start token.

The same interface as inputs.PromptProcessor (the engine calls either): encode_many / encode give the checked
source ids of each job, tokenize the source ids of a text, detokenize the text of TARGET ids (what a response's
tokens mean; the target vocabulary may differ from the source's: g2p reads letters and writes phonemes).
Every error is a ValueError naming the field, raised on the event loop (or a worker thread for long texts).
"""
from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Sequence

from tokenizers import Tokenizer

from .inputs import check_params_vocab, check_token_ids, encode_texts, unpadded
from .params import GenerationParams
from .seq2seq_spec import SourceSpec
from .spec import DecoderSpec


class SourceProcessor:
    def __init__(self, spec: DecoderSpec, source: SourceSpec, tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer) -> None:
        self.spec = spec              # the decoder side: target vocabulary, self-cache length
        self.source = source
        self.tokenizer = unpadded(tokenizer)
        self.target_tokenizer = unpadded(target_tokenizer)

    @cached_property
    def _truncating(self) -> Tokenizer:
        """The source tokenizer cutting at max_source_length itself (its post-processor's tokens kept, as
        transformers' truncation keeps a Marian source's closing </s>)."""
        copy = Tokenizer.from_str(self.tokenizer.to_str())
        copy.enable_truncation(self.source.max_length)
        return copy

    def fit(self, params: GenerationParams) -> GenerationParams:
        """The parameters as served: a default max_new_tokens (none asked for) beyond what the target length holds
        becomes that (a g2p model of 32 target positions answers a plain call instead of refusing it)."""
        room = self.spec.max_length - 1
        if params.default_max_new_tokens and params.max_new_tokens > room:
            return dataclasses.replace(params, max_new_tokens=room, min_tokens=min(params.min_tokens, room))
        return params

    def encode_many(self, jobs: Sequence[tuple[str | list[int], GenerationParams]], batched: bool = True
                    ) -> list[list[int]]:
        """`encode` of each job; the texts tokenized in one batch (each distinct text once; batched as in
        PromptProcessor.encode_many)."""
        texts: dict[tuple[str, bool], list[int]] = {}
        for prompt, params in jobs:
            if isinstance(prompt, str) and prompt:
                texts.setdefault((self._bounded(prompt, params.truncate_prompt), params.truncate_prompt), [])
        for cut in (False, True):
            batch = [text for text, truncate in texts if truncate is cut]
            if batch:
                tokenizer = self._truncating if cut else self.tokenizer
                for text, ids in zip(batch, encode_texts(tokenizer, batch, batched)):
                    texts[(text, cut)] = ids
        return [self.encode(p, params, texts.get((self._bounded(p, params.truncate_prompt), params.truncate_prompt))
                            if isinstance(p, str) and p else None) for p, params in jobs]

    def encode(self, prompt: str | list[int], params: GenerationParams, text_ids: list[int] | None = None) -> list[int]:
        """The source ids of one job, or ValueError naming the field."""
        if not isinstance(params, GenerationParams):
            raise TypeError("params must be a GenerationParams (use GenerationParams.validate)")
        limit, room = self.source.max_length, self.spec.max_length - 1
        if params.max_new_tokens > room:
            raise ValueError(f"parameters.max_new_tokens: must be at most {room} (the model's max_target_length of "
                             f"{self.spec.max_length} tokens, less its start token), got {params.max_new_tokens}")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: must not be empty (an encoder-decoder model generates from a source text)")
            ids = self.tokenize(prompt, params.truncate_prompt) if text_ids is None else text_ids
        elif isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt: must not be empty (an encoder-decoder model generates from a source)")
            if len(prompt) > limit and not params.truncate_prompt:
                raise ValueError(f"prompt: {len(prompt)} tokens exceed the model's max_source_length of {limit} "
                                 "(shorten it, or set truncate_prompt)")
            ids = list(prompt[:limit])
            check_token_ids(ids, self.source.vocab_size, "prompt")
        else:
            raise ValueError(f"prompt: must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt: the source text encodes to no tokens")
        if len(ids) > limit:
            raise ValueError(f"prompt: {len(ids)} tokens exceed the model's max_source_length of {limit} "
                             "(shorten it, or set truncate_prompt)")
        check_params_vocab(params, self.spec.vocab_size)
        if params.target_language is not None:
            self.source.language_id(params.target_language)
        if params.source_language is not None:
            if not isinstance(prompt, str):
                raise ValueError("source_language: only with a text prompt (token ids already hold their language)")
            ids = self.source.with_source_language(ids, params.source_language)
        return ids

    def tokenize(self, text: str, truncate: bool = False, batched: bool = False) -> list[int]:
        """The source ids of a text (truncate: cut at max_source_length by the tokenizer itself)."""
        text = self._bounded(text, truncate)
        if not text:
            return []
        tokenizer = self._truncating if truncate else self.tokenizer
        # (encode_batch releases the GIL while it works, encode holds it: a worker thread calls the former)
        return list((tokenizer.encode_batch([text])[0] if batched else tokenizer.encode(text)).ids)

    def _bounded(self, text: str, truncate: bool) -> str:
        """The text, or (truncate) its head that can hold the first max_source_length tokens; ValueError when it
        is longer than any source that can fit (tokenizing megabytes would hold the event loop)."""
        max_chars = (self.source.max_length + 1) * 100
        if len(text) > max_chars:
            if not truncate:
                raise ValueError(f"prompt: {len(text)} characters cannot fit the model's max_source_length of "
                                 f"{self.source.max_length} tokens (shorten it, or set truncate_prompt)")
            text = text[:max_chars]
        return text

    def detokenize(self, token_ids: list[int], batched: bool = False) -> str:
        """The text of target ids (a response's tokens), each checked against the target vocabulary."""
        check_token_ids(token_ids, self.spec.vocab_size, "tokens")
        if batched:
            return self.target_tokenizer.decode_batch([token_ids], skip_special_tokens=False)[0]
        return self.target_tokenizer.decode(token_ids, skip_special_tokens=False)

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of source ids (an echoed token-id prompt: the source is the prompt)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)
