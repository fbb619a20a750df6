"""Greedy and seeded-sampling streams pinned to what main produced BEFORE decoding strategies moved behind one
interface (recorded on main at 12a7a79 with this very test's `_streams`, then pasted below): the strategies
refactor must not change a byte of text, a token id, or a logprob of these streams.

The values depend on the shared tiny-gpt package (tests/conftest.py builds it from torch.manual_seed(0)) scaled
as test_generation_engine's `gpt` fixture does."""
from __future__ import annotations

import asyncio
import hashlib

from server.generation import GenerationParams
from tests.unit.test_generation_engine import PROMPTS, Package, gpt, run, tiny_gpt  # noqa: F401  (fixtures)

CASES = [
    (PROMPTS[0], dict(max_new_tokens=12, ignore_eos=True)),
    (PROMPTS[2], dict(max_new_tokens=12, temperature=1.3, top_p=0.9, seed=7, ignore_eos=True)),
    (PROMPTS[1], dict(max_new_tokens=12, temperature=0.8, top_k=20, seed=11, logprobs=True, top_logprobs=2,
                      ignore_eos=True)),
    (PROMPTS[4], dict(max_new_tokens=12, temperature=1.0, min_p=0.05, seed=3, repetition_penalty=1.2,
                      ignore_eos=True)),
    (PROMPTS[3], dict(max_new_tokens=10, temperature=1.1, seed=5, presence_penalty=0.5, frequency_penalty=0.3,
                      logprobs=True)),
]

# Recorded on main (12a7a79), before the change: (text, token ids, sha256 of the logprobs' repr).
RECORDED: list[tuple[str, list[int], str]] = [
    ('��� asked asked{{{{ y{{', [230, 230, 161, 341, 341, 91, 91, 91, 91, 324, 91, 91],
     '1abede31870dfdc980b437ad7d44f10ec78b79dc823230e40252f7db768d4eba'),
    ('ardena, bfI s� early�\x07 early', [389, 65, 12, 262, 70, 41, 258, 224, 391, 150, 196, 391],
     '1abede31870dfdc980b437ad7d44f10ec78b79dc823230e40252f7db768d4eba'),
    ('\x08\x08-�{ th�{ y䇼', [197, 197, 13, 226, 91, 264, 161, 91, 324, 161, 230, 121],
     'c0fb4ab799a304416b03f7e167f8bf062079d083426faa8ea1e24162ccd4cbcf'),
    ('S� asked\rI�\x18Q�{�', [51, 121, 341, 202, 41, 179, 213, 49, 244, 91, 161, 225],
     '1abede31870dfdc980b437ad7d44f10ec78b79dc823230e40252f7db768d4eba'),
    (' stoodgh\x06�B��8? river', [318, 302, 195, 122, 34, 151, 176, 24, 31, 398],
     'b834ed96c65b5b42857d33e2e359be957cbcc24f0069d6f1b1efec7bdee4a45d'),
]


def _streams(gpt: Package) -> list[tuple[str, list[int], str]]:
    async def body() -> list[tuple[str, list[int], str]]:
        async with gpt.engine() as engine:
            async def one(prompt: str, kw: dict) -> tuple[str, list[int], str]:
                text, ids, scores = "", [], []
                async for chunk in engine.stream(prompt, GenerationParams.validate(**kw)):
                    text += chunk.text
                    ids += [t.token_id for t in chunk.tokens]
                    scores += [(t.logprob, [(a.token_id, a.logprob) for a in t.top_logprobs]) for t in chunk.tokens]
                return text, ids, hashlib.sha256(repr(scores).encode()).hexdigest()

            return list(await asyncio.gather(*(one(p, kw) for p, kw in CASES)))

    return run(body())


def test_fixed_seed_streams_are_byte_identical_to_the_recorded_ones(gpt: Package) -> None:
    got = _streams(gpt)
    assert got == RECORDED


def test_whole_answers_carry_the_recorded_streams(gpt: Package) -> None:
    """A unary request without stop strings makes its text once, at its end (Sequence.catch_up), instead of token
    by token: the same text (partial UTF-8 characters included), token ids and logprobs as the recorded streams."""
    async def body() -> list[tuple[str, list[int], str]]:
        async with gpt.engine() as engine:
            async def one(prompt: str, kw: dict) -> tuple[str, list[int], str]:
                result = await engine.generate(prompt, GenerationParams.validate(**kw))
                scores = [(t.logprob, [(a.token_id, a.logprob) for a in t.top_logprobs]) for t in result.tokens]
                return (result.text, [t.token_id for t in result.tokens],
                        hashlib.sha256(repr(scores).encode()).hexdigest())

            return list(await asyncio.gather(*(one(p, kw) for p, kw in CASES)))

    assert run(body()) == RECORDED
