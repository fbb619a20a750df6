"""One request streamed through both doors of a real server process — gRPC GenerateStream (our client) and an
OpenAI /v1/completions SSE stream (the openai client) — with the same sampling seed gives the same chunks: the
same tokens (the ids gRPC names are the tokens SSE spells, by the package's own tokenizer), the same text cut at
the same places, the same finish reason. Both doors read one stream object (server/leases.py)."""
from __future__ import annotations

from itertools import accumulate
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from tests.server_process import ServerProcess

GPT = "tiny-gpt"
PROMPT = "To be, or not to be"


def _cuts(token_counts: list[int], texts: list[str]) -> dict[int, str]:
    """Where a stream's chunks end: tokens so far -> text so far."""
    return dict(zip(accumulate(token_counts), accumulate(texts)))


@pytest.mark.parametrize("sampling", [dict(temperature=0.9, top_p=0.95, seed=1234),
                                      dict(temperature=1.3, seed=99)])
def test_grpc_and_sse_streams_of_one_seeded_request_agree(server: ServerProcess, tiny_repository: Path,
                                                          sampling: dict) -> None:
    new_tokens = 16
    with OrtserveClient(server.address, timeout=60) as client:
        chunks = list(client.generate_stream(PROMPT, GPT, max_new_tokens=new_tokens, ignore_eos=True, logprobs=True,
                                             **sampling))
    oai = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    events = list(oai.completions.create(model=GPT, prompt=PROMPT, max_tokens=new_tokens, logprobs=0, stream=True,
                                         extra_body={"ignore_eos": True}, **sampling))
    choices = [e.choices[0] for e in events if e.choices]

    ids = [t.token_id for c in chunks for t in c.tokens]
    spelled = [t for c in choices for t in c.logprobs.tokens]
    tokenizer = Tokenizer.from_file(str(tiny_repository / GPT / "1" / "tokenizer.json"))
    assert len(ids) == new_tokens and len(spelled) == new_tokens
    assert spelled == [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert "".join(c.text for c in chunks) == "".join(c.text for c in choices)
    # A reader that fell behind gets neighbouring chunks merged (either door): where both cut, they cut alike.
    grpc_cuts = _cuts([len(c.tokens) for c in chunks], [c.text for c in chunks])
    sse_cuts = _cuts([len(c.logprobs.tokens) for c in choices], [c.text for c in choices])
    common = grpc_cuts.keys() & sse_cuts.keys()
    assert new_tokens in common and all(grpc_cuts[k] == sse_cuts[k] for k in common)
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].finish_reason == "length"
    assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]


def test_a_seed_draws_the_same_on_both_doors_and_another_seed_differs(server: ServerProcess) -> None:
    """The agreement above is the seed's doing, not a model that always says the same thing."""
    draws = {}
    oai = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with OrtserveClient(server.address, timeout=60) as client:
        for seed in (5, 6, 7):
            grpc_text = "".join(c.text for c in client.generate_stream(PROMPT, GPT, max_new_tokens=24, ignore_eos=True,
                                                                       temperature=1.5, seed=seed))
            sse_text = "".join(e.choices[0].text for e in oai.completions.create(
                model=GPT, prompt=PROMPT, max_tokens=24, temperature=1.5, seed=seed, stream=True,
                extra_body={"ignore_eos": True}) if e.choices)
            draws[seed] = (grpc_text, sse_text)
    assert all(grpc_text == sse_text for grpc_text, sse_text in draws.values()), draws
    assert len({grpc_text for grpc_text, _ in draws.values()}) > 1, draws
