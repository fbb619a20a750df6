"""A served decoder (generate): the continuous-batching generation engine.

The engine (server/generation/) is built here as `GenerationEngine(session, manifest, tokenizer, config,
metrics, label, mixed_session)` from the typed manifest, and driven through start() / warmup() / generate() /
stream() / stop(). Raw KServe ModelInfer on a decoder's graph tensors is refused (INVALID_ARGUMENT naming the
model): its cache buffers belong to the engine, and onnxruntime's GroupQueryAttention kernel can crash the
process on inconsistent caller tensors. KServe's text mode (a BYTES input "prompt") generates through the engine.

With --generation-instances N there are N engines, each with sessions of its own (the weights loaded N times),
its worker thread and max_sequences slots; a request goes whole (its n completions, its beams) to the one with the
fewest sequences running, waiting or being admitted. On 2 cores two engines of one onnxruntime thread each beat
one engine of two threads where a step's many small nodes each cost a hand-off between the threads (the OPUS-MT
shape's batch jobs), not where the event loop is the limit (g2p; bench/FINDINGS.md).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

import onnxruntime as ort

from modelpkg import TOKENIZER_FILE
from server.repository.consistency import check_prompts, check_tokenizer
from server.protocol.errors import ServingError
from server.generation import GenerationEngine, GenerationParams, GenerationResult, OverloadedError
from server.generation.admission import INLINE_PROMPT_SIZE, Job
from server.generation.errors import engine_errors
from server.generation.streams import SequenceStream
from server.model import Feeds, Loaded, ServedModel
from server.sessions import create_session
from server.text.tokenizer import load_tokenizer
from server.text.spans import TokenSpan, encode_spans, special_ids
from server.protocol.types import ChatTemplate

log = logging.getLogger(__name__)


T = TypeVar("T")


class DecoderModel(ServedModel):
    def __init__(self, parts: Loaded) -> None:
        super().__init__(parts)
        self.tokenizer = load_tokenizer(self.package.file(TOKENIZER_FILE))
        self.engines = [self.build_engine(i) for i in range(self.runtime.generation_instances)]
        self.engine = self.engines[0]     # what every instance shares: spec, tokenizers, limits
        per_slot, total = self.cache_bytes
        log.info("%s: KV cache %d bytes per slot (context %d tokens), %d bytes in all (%d engine(s))", self.name,
                 per_slot, self.max_length, total, len(self.engines))

    def session(self, instance: int, file: str | None = None) -> ort.InferenceSession:
        """Instance 0 runs the loaded session; every other instance a session of its own of the same graph."""
        if instance == 0 and file is None:
            return self.runner.session
        return create_session(self.package, self.variant, self.runtime.session, file=file)

    def build_engine(self, instance: int = 0) -> GenerationEngine:
        mixed_file = self.manifest.cache.mixed_graph(self.variant) if self.manifest.cache is not None else None
        mixed = None if mixed_file is None else self.session(instance, mixed_file)
        return GenerationEngine(self.session(instance), self.manifest, self.tokenizer, self.runtime.generation,
                                self.metrics, self.name, mixed_session=mixed, instance=instance)

    def preferred(self) -> list[GenerationEngine]:
        """The engines in the order a new request tries them: the fewest sequences running, waiting or being
        admitted first."""
        return sorted(self.engines, key=lambda e: e.active_sequences + e.waiting_requests + e.admitting)

    async def first_fit(self, call: Callable[[GenerationEngine], Awaitable[T]]) -> T:
        """call(engine) on the preferred engine, and on the next when that one is full (its queue, or its own
        max_tokens_in_flight: the budget is per engine): a request goes where it fits. OverloadedError is raised at
        admission, before anything of the request starts, so trying the next engine loses nothing."""
        *others, last = self.preferred()
        for engine in others:
            try:
                return await call(engine)
            except OverloadedError:
                continue
        return await call(last)

    @property
    def max_batch_size(self) -> int:
        return self.engine.config.max_batch_size * len(self.engines)

    @property
    def max_length(self) -> int:
        return self.engine.spec.max_length     # the package's, or --max-model-len below it

    @property
    def cache_bytes(self) -> tuple[int, int]:
        return self.engine.self_cache_bytes[0], sum(e.self_cache_bytes[1] for e in self.engines)

    def warm_up(self) -> None:
        """The tokenizer checked against model.json (server/repository/consistency.py), the engine's runs (the largest
        token id and the last position included), then a prompt text through the engine's tokenizer path."""
        vocabulary = check_tokenizer(self.package, self.tokenizer)
        for engine in self.engines:
            engine.warmup()
        spec = self.engine.spec
        check_prompts(self.engine.tokenize, vocabulary, spec.vocab_size, spec.max_length)

    async def start(self) -> None:
        for engine in self.engines:
            await engine.start()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.stop()

    async def tokenize(self, text: str) -> list[TokenSpan]:
        with engine_errors():
            if len(text) <= INLINE_PROMPT_SIZE:
                return self._spans(text, False)
            return await asyncio.get_running_loop().run_in_executor(None, self._spans, text, True)

    def _spans(self, text: str, batched: bool) -> list[TokenSpan]:
        """The ids generation would run (the engine's bounds), with their strings and offsets."""
        ids = self.engine.tokenize_batched(text) if batched else self.engine.tokenize(text)
        tokenizer = self.engine.inputs.tokenizer
        special = special_ids(dict(self.manifest.special_tokens))
        found = encode_spans(tokenizer, text, special, batched)
        if [t.id for t in found] == ids:
            return found
        # (a prompt processor that cut or added ids: the ids are the truth, without offsets)
        return [TokenSpan(i, tokenizer.id_to_token(i) or "", i in special, 0, 0) for i in ids]

    async def detokenize(self, token_ids: list[int]) -> str:
        context = self.engine.spec.max_length
        if len(token_ids) > context:   # bounded before anything is looked at: a list may hold millions
            raise ServingError.invalid("tokens", f"{len(token_ids)} ids exceed the model's context of {context} "
                                                 "tokens (detokenize at most one context per request)")
        with engine_errors():
            if len(token_ids) <= INLINE_PROMPT_SIZE:
                return self.engine.detokenize(token_ids)
            return await asyncio.get_running_loop().run_in_executor(None, self.engine.detokenize_batched, token_ids)

    def prompt_text(self, token_ids: list[int]) -> str:
        with engine_errors():
            return self.engine.prompt_text(token_ids)

    def chat_template(self) -> ChatTemplate | None:
        found = super().chat_template()
        if found is None:
            return None
        variables = {}
        for name in ("bos_token", "eos_token"):
            token_id = self.manifest.special_tokens.get(name.removesuffix("_token"), None)
            token_id = self.manifest.special_tokens.get(name, token_id)
            text = self.tokenizer.id_to_token(token_id) if isinstance(token_id, int) else None
            if text is not None:
                variables[name] = text
        return ChatTemplate(found.template, variables)

    async def generate(self, prompt: str | list[int], params: GenerationParams,
                       deadline: float | None) -> GenerationResult:
        with engine_errors():
            return await self.first_fit(lambda engine: engine.generate(prompt, params, deadline))

    async def generate_many(self, jobs: list[Job], deadline: float | None, field: str) -> list[GenerationResult]:
        with engine_errors():
            return await self.first_fit(lambda engine: engine.generate_many(jobs, deadline, field))

    async def stream_many(self, jobs: list[Job], deadline: float | None, field: str) -> list[SequenceStream]:
        """The engine's own streams, unwrapped: their later errors are mapped by the one stream that reads them
        (server/leases.py), admission's here."""
        with engine_errors():
            return await self.first_fit(lambda engine: engine.stream_many(jobs, deadline, field))

    async def infer(self, inputs: Feeds, outputs: list[str] | None, deadline: float | None) -> Feeds:
        raise ServingError.invalid("model", f"{self.name!r} is a decoder whose KV cache belongs to the generation "
                                            f"engine: raw graph calls are not served; use Generate, GenerateStream "
                                            f"or ModelInfer text mode (input 'prompt')")

