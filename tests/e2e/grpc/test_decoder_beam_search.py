"""Beam search on decoder-only models: random GPT-2 and Llama checkpoints saved by `transformers`, exported by the
command line, equal to transformers' own `generate(num_beams=4)` — token ids and `sequences_scores` — in process
(the engine on the exported package), over gRPC (num_beams) and over HTTP (vLLM's `use_beam_search` with `best_of`,
and `num_beams`), the n best (n = 2) equal to its `num_return_sequences=2`.

The served score is computed from the served tokens' logprobs as transformers scores a hypothesis: the float32 sum
of its tokens' log-softmax, divided by its length ** length_penalty."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import onnxruntime as ort
import openai
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from modelpkg import Manifest
from server.generation import GenerationConfig, GenerationEngine, GenerationParams
from tests.decoder_beams import NEW, beam_score, hf_decoder, transformers_beams
from tests.door_calls import post_json
from tests.hf_decoder_export import serve_hf_decoders

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

PROMPTS = ["ROMEO. What light through yonder window breaks", "To be"]
KINDS = ("gpt2", "llama")


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    def build(vocab: int, eot: int) -> dict:
        return {k: hf_decoder(k, vocab, eot) for k in KINDS}

    with serve_hf_decoders(build, tiny_checkpoints.gpt, tmp_path_factory.mktemp("decoder-beams"),
                           ("--http-port", "0")) as served:
        yield served


def _check(got: list[tuple[list[int], list[float]]], want: list[tuple[list[int], float]],
           length_penalty: float = 1.0) -> None:
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, logprobs), (_, score) in zip(got, want):
        assert beam_score(logprobs, length_penalty) == pytest.approx(score, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_in_process_beams_equal_transformers_with_scores_and_two_best(served, kind: str) -> None:
    _, repo, models, tok = served
    d = repo / kind / "1"
    manifest = json.loads((d / "model.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(d / manifest["variants"]["fp32"]), options,
                                   providers=["CPUExecutionProvider"])

    async def body() -> list[list[tuple[list[int], list[float]]]]:
        engine = GenerationEngine(session, Manifest.from_dict(manifest), Tokenizer.from_file(str(d / "tokenizer.json")),
                                  GenerationConfig(max_batch_size=6, prefill_chunk_tokens=4, max_prefill_tokens=4),
                                  None, "test")
        await engine.start()
        try:
            params = GenerationParams.validate(max_new_tokens=NEW, num_beams=4, logprobs=True)
            answers = []
            for prompt in PROMPTS:   # n = 2: two jobs of one search, ranks 0 and 1 (as OpenAI's n arrives)
                # Beside a running stream, the search's prompt in chunks of 4 (max_prefill_tokens 4) as it decodes.
                stream = engine.stream("To be", GenerationParams.validate(max_new_tokens=40, ignore_eos=True))
                await stream.__anext__()
                jobs = [(prompt, dataclasses.replace(params, beam_rank=j)) for j in range(2)]
                results = await engine.generate_many(jobs)
                answers.append([([t.token_id for t in r.tokens], [t.logprob for t in r.tokens]) for r in results])
                await stream.aclose()
            return answers
        finally:
            await engine.stop()

    for prompt, got in zip(PROMPTS, asyncio.run(asyncio.wait_for(body(), 120))):
        _check(got, transformers_beams(models[kind], tok.encode(prompt).ids, 2))


@pytest.mark.parametrize("kind", KINDS)
def test_grpc_beams_equal_transformers(served, kind: str) -> None:
    server, _, models, tok = served
    with OrtserveClient(server.address, timeout=60) as client:
        for prompt in PROMPTS:
            got = client.generate(prompt, kind, max_new_tokens=NEW, num_beams=4, logprobs=True)
            _check([([t.token_id for t in got.tokens], [t.logprob for t in got.tokens])],
                   transformers_beams(models[kind], tok.encode(prompt).ids, 1))
        # A length penalty of its own: the same hypotheses transformers keeps under it, and its scores.
        got = client.generate(PROMPTS[0], kind, max_new_tokens=NEW, num_beams=4, length_penalty=0.5, logprobs=True)
        _check([([t.token_id for t in got.tokens], [t.logprob for t in got.tokens])],
               transformers_beams(models[kind], tok.encode(PROMPTS[0]).ids, 1, 0.5), 0.5)


@pytest.mark.parametrize("kind", KINDS)
def test_http_use_beam_search_and_num_beams_equal_transformers_n_best(served, kind: str) -> None:
    server, _, models, tok = served
    ids = tok.encode(PROMPTS[0]).ids
    want = transformers_beams(models[kind], ids, 2)
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="none", timeout=60, max_retries=0)
    for spelling in ({"best_of": 4, "extra_body": {"use_beam_search": True}}, {"extra_body": {"num_beams": 4}}):
        answer = client.completions.create(model=kind, prompt=[ids], max_tokens=NEW, n=2, logprobs=0, **spelling)
        choices = sorted(answer.choices, key=lambda c: c.index)
        assert [c.text for c in choices] == [tok.decode(w, skip_special_tokens=True) for w, _ in want], spelling
        for c, (_, score) in zip(choices, want):
            assert beam_score(c.logprobs.token_logprobs) == pytest.approx(score, rel=1e-4, abs=1e-4)


def test_http_refuses_use_beam_search_by_name(served) -> None:
    server, _, _, _ = served
    for body, field in (({"use_beam_search": True, "best_of": 4, "stream": True}, "use_beam_search"),
                        ({"use_beam_search": True}, "best_of"),
                        ({"use_beam_search": "yes", "best_of": 4}, "use_beam_search"),
                        ({"use_beam_search": True, "best_of": 4, "num_beams": 3}, "num_beams")):
        status, answer = post_json(f"{server.http_url}/v1/completions",
                                   {"model": "gpt2", "prompt": "To be", "max_tokens": 4, **body})
        assert status == 400, body
        assert answer["error"]["message"].startswith(field), (body, answer)
