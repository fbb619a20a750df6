"""What the engine needs to know about an encoder-decoder package, read from its typed manifest (the
`encoder_decoder` block, modelpkg) and checked against both graphs.

The decoder side is a DecoderSpec like any decoder's (the self cache: `max_length` is the block's
max_target_length, `vocab_size` the target vocabulary), so the scheduler, executor and slot runner treat its
rows as they treat a decoder's. The source side is a SourceSpec: the encoder graph's inputs, the cross buffers'
names and width (max_source_length), the source vocabulary, and the decoder's start token.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnxruntime as ort

from modelpkg import CACHE_ELEMENT_TYPES, LAYOUT_INPLACE, CacheSpec, Manifest, cross_names

from .spec import DecoderSpec

ENCODER_INPUTS = ("input_ids", "attention_mask")
SOURCE_MASK = "encoder_attention_mask"


@dataclass(frozen=True)
class SourceSpec:
    max_length: int          # max_source_length: the cross buffers' width, the longest source served
    vocab_size: int          # the source vocabulary (the encoder's embedding rows)
    start_id: int            # decoder_start_token_id: every hypothesis's first input
    pad_id: int              # fed at a source's padded positions (masked)
    num_layers: int          # decoder layers: one cross key and value each
    num_heads: int
    head_dim: int
    dtype: type              # the cross buffers' element type (the encoder's outputs')
    family: str = ""
    # transformers' generate forces these (ForcedBOS / ForcedEOS logits processors): the first generated token,
    # and the last one a request may generate (its max_new_tokens-th). None: nothing forced.
    forced_bos_id: int | None = None
    forced_eos_id: int | None = None
    # Translation models: language token -> id, what a request's target_language may name (forced first).
    languages: Mapping[str, int] = field(default_factory=dict)
    # The language token the tokenizer puts around every source and its index in the source ids (negative: from
    # the end); a request's source_language replaces it there. None: sources carry no language to replace.
    source_language: str | None = None
    source_language_index: int = 0

    def language_id(self, language: str, name: str = "target_language") -> int:
        """The id of a language token, or ValueError naming the field (`name`)."""
        if not self.languages:
            raise ValueError(f"{name}: this {self.family or 'encoder-decoder'} model has no languages "
                             f"(model.json encoder_decoder.languages is empty), got {language[:64]!r}")
        if language not in self.languages:
            known = sorted(self.languages)
            listed = ", ".join(known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "")
            raise ValueError(f"{name}: unknown language {language[:64]!r} (this model's: {listed})")
        return self.languages[language]

    def with_source_language(self, ids: list[int], language: str) -> list[int]:
        """Text source ids with their language token replaced by `language`'s, or ValueError naming
        source_language."""
        wanted = self.language_id(language, "source_language")
        if self.source_language is None:
            raise ValueError("source_language: this model's tokenizer puts no language token around a source "
                             "(model.json encoder_decoder.source_language is unset)")
        at = self.source_language_index
        if not -len(ids) <= at < len(ids) or ids[at] != self.languages[self.source_language]:
            raise ValueError(f"source_language: the source ids do not hold the tokenizer's {self.source_language} "
                             f"at index {at}")
        out = list(ids)
        out[at] = wanted
        return out

    def forced(self, max_new_tokens: int, target_language: str | None = None) -> dict[int, int]:
        """Generated index -> the token forced there: the target language's token (else the config's forced bos)
        first, the forced eos last (the eos wins where both fall, as transformers applies it last)."""
        out = {}
        if target_language is not None:
            out[0] = self.language_id(target_language)
        elif self.forced_bos_id is not None:
            out[0] = self.forced_bos_id
        if self.forced_eos_id is not None:
            out[max_new_tokens - 1] = self.forced_eos_id
        return out

    @property
    def cross_names(self) -> list[str]:
        """[cross.0.key, cross.0.value, cross.1.key, ...]: the encoder's outputs and the decoder's inputs."""
        return cross_names(self.num_layers)


def seq2seq_specs(manifest: Manifest, decoder: ort.InferenceSession, encoder: ort.InferenceSession
                  ) -> tuple[DecoderSpec, SourceSpec]:
    """Raises ValueError naming the manifest field or graph input/output that does not fit."""
    block = manifest.encoder_decoder
    if block is None:
        raise ValueError("model.json encoder_decoder: an encoder-decoder package needs its description")
    if manifest.cache is None:
        raise ValueError("model.json cache: an encoder-decoder package needs its self-attention cache description")
    cache: CacheSpec = manifest.cache
    if cache.layout != LAYOUT_INPLACE:
        raise ValueError(f"model.json cache.layout: an encoder-decoder package is served with the in-place cache, "
                         f"got {cache.layout!r}")
    target_vocab, source_vocab = block.target_vocab_size, block.source_vocab_size
    max_target, max_source = block.max_target_length, block.max_source_length
    eos, pad, start = block.eos_token_id, block.pad_token_id, block.decoder_start_token_id
    if (block.num_layers, block.num_heads, block.head_dim) != (cache.num_layers, cache.kv_heads, cache.head_dim):
        raise ValueError(f"model.json encoder_decoder: {block.num_layers} layers of {block.num_heads} heads of "
                         f"{block.head_dim}, but cache has {cache.num_layers} of {cache.kv_heads} of {cache.head_dim}")
    # The self cache is checked as any decoder's (names, heads, element type); the cross inputs beside it.
    decoder_spec = DecoderSpec.of_graph(cache, decoder, max_length=max_target, vocab_size=target_vocab, eos_id=eos,
                                        bos_id=None, pad_id=pad)
    d_inputs = {i.name: i for i in decoder.get_inputs()}
    crosses = cross_names(cache.num_layers)
    for name in [SOURCE_MASK, *crosses]:
        if name not in d_inputs:
            raise ValueError(f"decoder graph: input {name!r} missing (model.json cache.num_layers={cache.num_layers}); "
                             f"inputs are {sorted(d_inputs)}")
    e_inputs = {i.name for i in encoder.get_inputs()}
    e_outputs = {o.name: o for o in encoder.get_outputs()}
    for name in ENCODER_INPUTS:
        if name not in e_inputs:
            raise ValueError(f"encoder graph: input {name!r} missing; inputs are {sorted(e_inputs)}")
    for name in crosses:
        if name not in e_outputs:
            raise ValueError(f"encoder graph: output {name!r} missing; outputs are {sorted(e_outputs)}")
        dims = d_inputs[name].shape
        if len(dims) != 4 or dims[1] != cache.kv_heads or dims[3] != cache.head_dim:
            raise ValueError(f"decoder graph: input {name!r} has shape {dims}, expected "
                             f"[batch, {cache.kv_heads}, source, {cache.head_dim}]")
        if e_outputs[name].type != d_inputs[name].type:
            raise ValueError(f"encoder graph: output {name!r} is {e_outputs[name].type}, the decoder takes "
                             f"{d_inputs[name].type}")
    cross_type = d_inputs[crosses[0]].type
    if cross_type not in CACHE_ELEMENT_TYPES:
        raise ValueError(f"decoder graph: input {crosses[0]!r} has type {cross_type}, expected float32 or float16")
    # A source's padding: the pad id when the source vocabulary has it (shared vocabularies), else 0 (masked anyway).
    source = SourceSpec(max_length=max_source, vocab_size=source_vocab, start_id=start,
                        pad_id=pad if pad < source_vocab else 0, num_layers=cache.num_layers,
                        num_heads=cache.kv_heads, head_dim=cache.head_dim,
                        dtype=np.dtype(CACHE_ELEMENT_TYPES[cross_type]).type, family=block.family,
                        forced_bos_id=block.forced_bos_token_id, forced_eos_id=block.forced_eos_token_id,
                        languages=dict(block.languages), source_language=block.source_language,
                        source_language_index=block.source_language_index)
    return decoder_spec, source
