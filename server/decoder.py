"""A served decoder (generate): the continuous-batching generation engine, plus raw graph calls.

The engine (server/generation/) is built here exactly as
`GenerationEngine(session, manifest_dict, tokenizer, config, metrics, label)` and driven through
start() / warmup() / generate() / stream() / stop(). Raw KServe ModelInfer runs a concat-layout graph directly:
the caller brings its own cache tensors, which do not batch with the engine's sequences. An in-place-cache
graph (cache.layout "inplace") is refused raw calls: its cache buffers belong to the engine, and onnxruntime's
GroupQueryAttention kernel can crash the process on inconsistent caller tensors.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Iterator

from modelpkg import LAYOUT_INPLACE, TOKENIZER_FILE
from server.errors import Code, ServingError
from server.generation import (EngineStoppedError, GenerationEngine, GenerationParams, GenerationResult,
                               OverloadedError, StreamChunk)
from server.model import Feeds, Loaded, ServedModel
from server.sessions import create_session, run_failure
from server.tokenization import load_tokenizer
from server.types import ChatTemplate


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The generation engine's exceptions -> ServingError."""
    try:
        yield
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    except OverloadedError as exc:
        raise ServingError(Code.RESOURCE_EXHAUSTED, str(exc)) from None
    except TimeoutError as exc:
        raise ServingError(Code.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded") from None
    except EngineStoppedError as exc:
        raise ServingError(Code.UNAVAILABLE, str(exc)) from None
    except RuntimeError as exc:
        raise ServingError(Code.INTERNAL, str(exc)) from None


class DecoderModel(ServedModel):
    def __init__(self, parts: Loaded) -> None:
        super().__init__(parts)
        tokenizer = self.tokenizer = load_tokenizer(self.package.file(TOKENIZER_FILE))
        mixed_file = self.manifest.cache.mixed_graph(self.variant) if self.manifest.cache is not None else None
        mixed = None
        if mixed_file is not None:
            mixed = create_session(self.package, self.variant, self.runtime.session, file=mixed_file)
        # The engine takes the manifest as a plain dict (model.json as written).
        self.engine = GenerationEngine(self.runner.session, self.manifest.to_dict(), tokenizer,
                                       self.runtime.generation, self.metrics, self.name, mixed_session=mixed)

    @property
    def max_batch_size(self) -> int:
        return self.engine.config.max_batch_size

    def warm_up(self) -> None:
        self.engine.warmup()

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.stop()

    def tokenize(self, text: str) -> list[int]:
        with engine_errors():
            return self.engine.tokenize(text)

    def detokenize(self, token_ids: list[int]) -> str:
        with engine_errors():
            return self.engine.detokenize(token_ids)

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
            return await self.engine.generate(prompt, params, deadline)

    async def stream(self, prompt: str | list[int], params: GenerationParams,
                     deadline: float | None) -> AsyncIterator[StreamChunk]:
        """Chunks of one sequence; closing the iterator cancels the sequence and frees its slot."""
        chunks = self.engine.stream(prompt, params, deadline)
        try:
            with engine_errors():
                async for chunk in chunks:
                    yield chunk
        finally:
            await chunks.aclose()

    async def infer(self, inputs: Feeds, outputs: list[str] | None, deadline: float | None) -> Feeds:
        if self.manifest.cache is not None and self.manifest.cache.layout == LAYOUT_INPLACE:
            raise ServingError.invalid("model", f"{self.name!r} has an in-place KV cache (cache.layout "
                                                f"'inplace'): raw graph calls are not served; use Generate, "
                                                f"GenerateStream or ModelInfer text mode (input 'prompt')")
        self.check_raw_inputs(inputs)
        self.check_deadline(deadline)
        wanted = self.wanted_outputs(outputs)
        self.check_raw_cost(inputs, wanted)
        rows = next(iter(inputs.values())).shape[0] if next(iter(inputs.values())).ndim else 1
        started = asyncio.get_running_loop().time()
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, self.runner.run, inputs, wanted)
        except Exception as exc:
            raise run_failure(exc) from None
        self.stats.record_execution(rows, asyncio.get_running_loop().time() - started)
        self.metrics.batch_size.labels(self.name).observe(rows)
        return result
