"""The engine's model-specific parts, chosen by the typed manifest: a decoder's, or an encoder-decoder's.

Both kinds run the same engine (engine.py: admission, the loop, scheduler, executor, outputs); what differs is
    - input processing: a decoder's prompt ids (inputs.PromptProcessor), or an encoder-decoder's source ids
      (source.SourceProcessor; the decoder's prompt is then its start token);
    - the runner: the self cache's slot calls (slot_runner.SlotRunner), plus for an encoder-decoder the cross
      buffers bound by slot range and the encoder step at admission (cross_runner.CrossSlotRunner);
    - the tokenizer that turns generated ids into text (the target's, when an encoder-decoder has its own).
"""
from __future__ import annotations

from dataclasses import dataclass

import onnxruntime as ort
from tokenizers import Tokenizer

from modelpkg import Manifest

from .context_cap import cap_context
from .cross_runner import CrossSlotRunner
from .inputs import PromptProcessor
from .runner import InputProcessor, Runner
from .seq2seq_spec import SourceSpec, seq2seq_specs
from .slot_runner import SlotRunner
from .source import SourceProcessor
from .spec import DecoderSpec


@dataclass(frozen=True)
class EngineParts:
    spec: DecoderSpec                              # the self cache and what generation reads per token
    inputs: InputProcessor
    runner: Runner
    tokenizer: Tokenizer                           # decodes generated ids
    source: SourceSpec | None = None               # encoder-decoder packages

    @property
    def prefix_reuse(self) -> bool:
        """Whether a slot's keys/values may be reused by another prompt: never for an encoder-decoder (they
        depend on the source, not only on the tokens before them)."""
        return self.source is None


def engine_parts(session: ort.InferenceSession, manifest: Manifest, tokenizer: Tokenizer, num_slots: int,
                 mixed_session: ort.InferenceSession | None = None, runner: Runner | None = None,
                 encoder_session: ort.InferenceSession | None = None,
                 target_tokenizer: Tokenizer | None = None, max_model_len: int = 0) -> EngineParts:
    """ValueError naming what does not fit (the manifest field, the graph input, a missing encoder session, a
    max_model_len past the package's context)."""
    if manifest.encoder_decoder is None:
        spec = cap_context(DecoderSpec.from_package(manifest, session), max_model_len, "model.json max_length")
        inputs = PromptProcessor(spec, tokenizer)
        return EngineParts(spec, inputs, runner or SlotRunner(session, spec, num_slots, mixed_session),
                           inputs.tokenizer)
    if encoder_session is None:
        raise ValueError("model.json encoder_decoder: an encoder-decoder package is served with its encoder graph "
                         "(no encoder session was given)")
    if mixed_session is not None:
        raise ValueError("model.json encoder_decoder: an encoder-decoder package has no mixed graph")
    spec, source = seq2seq_specs(manifest, session, encoder_session)
    spec = cap_context(spec, max_model_len, "model.json encoder_decoder.max_target_length")
    processor = SourceProcessor(spec, source, tokenizer, target_tokenizer or tokenizer)
    return EngineParts(spec, processor, runner or CrossSlotRunner(session, spec, source, num_slots, encoder_session),
                       processor.target_tokenizer, source)
