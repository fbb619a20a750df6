"""The engine's seams, typed: what the loop, executor and warm-up call on the runner, and what admission and the
engine call on the input processor. factory.py picks the implementations by the manifest (a decoder's
slot_runner.SlotRunner + inputs.PromptProcessor; an encoder-decoder's cross_runner.CrossSlotRunner +
source.SourceProcessor); nothing past the factory asks which it has.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from .params import GenerationParams

if TYPE_CHECKING:
    from .device_cache import CacheBuffers, Device
    from .encoder_step import EncodeRow
    from .scheduler import Copy
    from .slot_runner import DecodeRow, PrefillRow


class Runner(Protocol):
    """onnxruntime calls over the slot cache (synchronous: the engine's worker thread runs them)."""

    session: ort.InferenceSession
    mixed_session: ort.InferenceSession | None
    num_slots: int
    cache: "CacheBuffers"

    @property
    def cache_bytes(self) -> int: ...

    @property
    def device(self) -> "Device": ...

    def decode(self, rows: list["DecodeRow"], idle_positions: dict[int, int]) -> np.ndarray:
        """One token per row -> logits [rows, >= vocab]."""

    def prefill(self, rows: list["PrefillRow"], first_prompt: bool) -> np.ndarray:
        """Prompt chunks -> logits [rows, width, >= vocab]."""

    def decode_and_prefill(self, rows: list["DecodeRow"], idle_positions: dict[int, int],
                           chunk: list["PrefillRow"], first_prompt: bool) -> tuple[np.ndarray, np.ndarray]:
        """Both in one run of the mixed graph."""

    def copy_prefix(self, source: int, target: int, length: int) -> None: ...

    def copy_prefixes(self, copies: list["Copy"]) -> None: ...

    def encode(self, rows: list["EncodeRow"]) -> None:
        """Sources into their slots (an encoder-decoder's encoder step; a decoder has none to run)."""

    def warm(self, label: str) -> None:
        """After the warm-up's calls: whatever the runner's own parts need (an encoder-decoder's source side)."""

    def idle(self) -> None:
        """Nothing in flight: the runner may tidy its buffers."""


class InputProcessor(Protocol):
    """A request's prompt -> checked ids (a decoder's prompt, an encoder-decoder's source), and ids -> text."""

    tokenizer: Tokenizer

    def fit(self, params: GenerationParams) -> GenerationParams: ...

    def encode_many(self, jobs: Sequence[tuple[str | list[int], GenerationParams]], batched: bool = True
                    ) -> list[list[int]]: ...

    def encode(self, prompt: str | list[int], params: GenerationParams,
               text_ids: list[int] | None = None) -> list[int]: ...

    def tokenize(self, text: str, truncate: bool = False, batched: bool = False) -> list[int]: ...

    def detokenize(self, token_ids: list[int], batched: bool = False) -> str: ...

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of an admitted token-id prompt (an encoder-decoder's: its source's)."""
