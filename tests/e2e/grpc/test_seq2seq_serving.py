"""Encoder-decoder packages served by a real server process: random Hugging Face Marian, BART and T5 checkpoints (and a
Marian with its own target vocabulary) exported by the exporter (testing/seq2seq_checkpoints.py), then greedy and
beam-4 answers through the real doors equal `transformers` generate on a padded batch and the offline reference
decoder (testing/seq2seq_offline.py); sequences joining and leaving a running batch (beside a beam search) equal
offline decoding; bad input is refused naming the field."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import httpx2 as httpx
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from clients.errors import OrtserveError
from testing.launch import wait_for
from tests.server_process import ROOT, ServerProcess

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAMES = ("marian", "bart", "t5", "marian-two-vocabs")
# Sources of different lengths (the char tokenizer: one token per character, </s> appended).
SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!"]
NEW = 9


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from testing.seq2seq_checkpoints import export_repository

    return export_repository(tmp_path_factory.mktemp("seq2seq-serving"), NAMES)


@pytest.fixture(scope="module")
def server(packages: dict[str, Path]):
    repository = packages["marian"].parent.parent
    # One onnxruntime thread: a core is left for the event loop, so short steps overlap its work (--overlap-step-ms).
    with ServerProcess(repository, ["--max-sequences", "6", "--http-port", "0", "--metrics-port", "0",
                                    "--intra-op-threads", "1"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with OrtserveClient(server.address, timeout=60) as c:
        yield c


def _tokenizers(package: Path) -> tuple[Tokenizer, Tokenizer]:
    spec = json.loads((package / "model.json").read_text())["encoder_decoder"]
    return (Tokenizer.from_file(str(package / "tokenizer.json")),
            Tokenizer.from_file(str(package / (spec["target_tokenizer"] or "tokenizer.json"))))


def _hf_generate(name: str, package: Path, sources: list[str], **kwargs) -> list[list[int]]:
    """transformers' generate on the sources as ONE right-padded batch, its own generation defaults on (Marian's and
    BART's forced eos at the length limit); each row's new ids up to its eos."""
    from testing.seq2seq_checkpoints import hf_model

    model = hf_model(name)
    source, _ = _tokenizers(package)
    rows = [source.encode(s).ids for s in sources]
    width, pad = max(map(len, rows)), model.config.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, **kwargs)
    eos = model.config.eos_token_id
    answers = []
    for row in out[:, 1:].tolist():
        answers.append(row[:row.index(eos) + 1] if eos in row else row)
    return answers


def _check_logprobs(package: Path, text: str, ids: list[int], logprobs: list[float], new: int = NEW) -> None:
    """Each served token's logprob equals the offline decoder's, teacher-forced through its own cache
    (random models repeat tokens, so equal ids alone would say little), forced steps aside."""
    from testing.seq2seq_offline import load_package, stepped_logits

    pkg = load_package(package)
    source, _ = _tokenizers(package)
    rows = stepped_logits(pkg, source.encode(text).ids, [pkg.spec.decoder_start_token_id, *ids[:-1]]).astype(float)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    forced = {0: pkg.spec.forced_bos_token_id, new - 1: pkg.spec.forced_eos_token_id}
    for i, (token, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        if forced.get(i) is None:
            assert logprob == pytest.approx(rows[i, token], abs=1e-4), (text, i)


def _offline(package: Path, sources: list[str], new: int = NEW) -> list[list[int]]:
    from testing.seq2seq_offline import greedy, load_package

    pkg = load_package(package)
    source, _ = _tokenizers(package)
    return [greedy(pkg, source.encode(s).ids, new) for s in sources]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_answers_of_concurrent_requests_equal_transformers_and_the_offline_decoder(
        client: OrtserveClient, packages: dict[str, Path], name: str) -> None:
    with ThreadPoolExecutor(len(SOURCES)) as pool:       # sent together: encoded and decoded as one batch
        results = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=NEW, logprobs=True), SOURCES))
    got = [[t.token_id for t in r.tokens] for r in results]
    assert got == _hf_generate(name, packages[name], SOURCES, do_sample=False, num_beams=1)
    assert got == _offline(packages[name], SOURCES)
    for text, r, ids in zip(SOURCES, results, got):
        _check_logprobs(packages[name], text, ids, [t.logprob for t in r.tokens])
    source, target = _tokenizers(packages[name])
    for r, ids, text in zip(results, got, SOURCES):
        eos = r.finish_reason == "eos"
        assert r.text == target.decode(ids[:-1] if eos else ids, skip_special_tokens=True)
        assert r.usage.prompt_tokens == len(source.encode(text).ids) and r.usage.completion_tokens == len(ids)


@pytest.mark.parametrize("name", ["marian", "bart", "t5"])
def test_beam_search_equals_transformers_num_beams_4_with_its_n_best(client: OrtserveClient, server: ServerProcess,
                                                                      packages: dict[str, Path], name: str) -> None:
    with ThreadPoolExecutor(len(SOURCES)) as pool:
        results = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=NEW, num_beams=4), SOURCES))
    want = _hf_generate(name, packages[name], SOURCES, do_sample=False, num_beams=4)
    assert [[t.token_id for t in r.tokens] for r in results] == want
    # OpenAI's n: the 2 best hypotheses of one search, best first; and a length penalty that changes the ranking.
    _, target = _tokenizers(packages[name])
    for penalty in (1.0, 0.0):
        answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60, json={
            "model": name, "prompt": SOURCES[2], "max_tokens": NEW, "num_beams": 4, "n": 2,
            "length_penalty": penalty, "early_stopping": True})
        assert answer.status_code == 200, answer.text
        texts = [c["text"] for c in sorted(answer.json()["choices"], key=lambda c: c["index"])]
        best = _hf_generate(name, packages[name], [SOURCES[2]], do_sample=False, num_beams=4,
                            num_return_sequences=2, length_penalty=penalty, early_stopping=True)
        eos = packages_eos(packages[name])
        assert texts == [target.decode([t for t in ids if t != eos], skip_special_tokens=True) for ids in best]


def packages_eos(package: Path) -> int:
    return json.loads((package / "model.json").read_text())["encoder_decoder"]["eos_token_id"]


@pytest.mark.parametrize("name", ["marian", "t5"])
def test_sequences_joining_and_leaving_a_running_batch_equal_offline_decoding(
        server: ServerProcess, packages: dict[str, Path], name: str) -> None:
    """6 slots: two streams leave after 2 tokens, a beam search holds 4 slots for a while, later requests wait for
    slots and join the decode batch mid-run (rows at different target positions in one call: T5's relative bias
    per row); every finished answer equals offline greedy (and transformers' beams). Requests arriving while
    others decode make the engine compute steps ahead while its loop applies the last (--overlap-step-ms)."""
    texts = ["some words", "x", "a longer source sentence here", "yes", "no way", "bonjour tout le monde",
             "quick", "brown fox"]
    leave = {1, 4}
    out: dict[int, list[int]] = {}
    scores: dict[int, list[float]] = {}

    def stream(i: int) -> None:
        time.sleep(0.015 * i)
        with OrtserveClient(server.address, timeout=60) as c:
            ids: list[int] = []
            for chunk in c.generate_stream(texts[i], name, max_new_tokens=NEW, logprobs=True):
                ids += [t.token_id for t in chunk.tokens]
                scores.setdefault(i, []).extend(t.logprob for t in chunk.tokens)
                if i in leave and len(ids) >= 2:
                    break            # closing the stream cancels it: its slot goes to a waiting one
            out[i] = ids

    def beams() -> None:
        time.sleep(0.02)
        with OrtserveClient(server.address, timeout=60) as c:
            out[-1] = [t.token_id for t in c.generate(texts[2], name, max_new_tokens=NEW, num_beams=4).tokens]

    overlapped = server.metric("ortserve_overlapped_steps_total", model=name)
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(texts))]
    threads.append(threading.Thread(target=beams))
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    offline = _offline(packages[name], texts)
    for i in range(len(texts)):
        assert out[i] == (offline[i][:len(out[i])] if i in leave else offline[i]), (i, texts[i])
        if i not in leave:
            _check_logprobs(packages[name], texts[i], out[i], scores[i])
    assert out[-1] == _hf_generate(name, packages[name], [texts[2]], do_sample=False, num_beams=4)[0]
    wait_for(lambda: server.metric("ortserve_active_sequences", model=name) == 0, 10, "every slot given back")
    if len(os.sched_getaffinity(0)) > 1:     # on one core no step overlaps the loop (server/runtime_config.py)
        assert server.metric("ortserve_overlapped_steps_total", model=name) > overlapped


def test_sampling_with_a_seed_is_reproducible_and_stays_in_the_target_vocabulary(client: OrtserveClient) -> None:
    a = client.generate("sampled source", "marian-two-vocabs", max_new_tokens=NEW, temperature=0.9, top_k=20, seed=7)
    b = client.generate("sampled source", "marian-two-vocabs", max_new_tokens=NEW, temperature=0.9, top_k=20, seed=7)
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    assert all(0 <= t.token_id < 45 for t in a.tokens)


def test_kserve_text_mode_the_cli_and_the_batch_script_answer_with_the_source_as_prompt(
        client: OrtserveClient, server: ServerProcess, tmp_path: Path) -> None:
    want = client.generate(SOURCES[0], "bart", max_new_tokens=NEW).text
    answer = httpx.post(f"{server.http_url}/v2/models/bart/infer", timeout=60, json={
        "inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": [SOURCES[0]]}],
        "parameters": {"max_new_tokens": NEW}})
    assert answer.status_code == 200, answer.text
    assert {o["name"]: o["data"] for o in answer.json()["outputs"]}["text"] == [want]
    cli = subprocess.run([sys.executable, "-m", "clients", "--address", server.address, "generate", SOURCES[0],
                          "--model", "bart", "--max-new-tokens", str(NEW)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.rstrip("\n") == want
    src, dst = tmp_path / "sources.txt", tmp_path / "out.jsonl"
    src.write_text("\n".join(SOURCES) + "\n")
    run = subprocess.run([sys.executable, "-m", "clients.batch", "generate", str(src), "-o", str(dst),
                          "--model", "bart", "--max-new-tokens", str(NEW), "--num-beams", "4",
                          "--address", server.address],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["text"] for r in records] == [client.generate(s, "bart", max_new_tokens=NEW, num_beams=4).text
                                            for s in SOURCES]


def _grpc_refusal(call) -> str:
    with pytest.raises(OrtserveError) as refused:
        call()
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    return refused.value.message


@pytest.mark.parametrize("kwargs,prompt,field", [
    ({}, "", "prompt: must not be empty"),
    ({}, "z" * 60, "prompt: 61 tokens exceed the model's max_source_length of 40"),
    ({}, [5] * 41, "prompt: 41 tokens exceed the model's max_source_length of 40"),
    ({"num_beams": 0}, "ok", "parameters.num_beams: must be in [1, 8]"),
    ({"num_beams": 100}, "ok", "parameters.num_beams: must be in [1, 8]"),
    ({"num_beams": 2, "temperature": 0.7}, "ok", "parameters.temperature: not served with num_beams > 1"),
    ({"max_new_tokens": 40}, "ok", "parameters.max_new_tokens: must be at most 39"),
])
def test_bad_input_is_refused_naming_the_field(client: OrtserveClient, kwargs, prompt, field) -> None:
    assert _grpc_refusal(lambda: client.generate(prompt, "marian", **kwargs)).startswith(field)


def test_beams_are_not_streamed_and_the_http_doors_name_the_field(client: OrtserveClient,
                                                                  server: ServerProcess) -> None:
    details = _grpc_refusal(lambda: list(client.generate_stream("ok", "marian", num_beams=4)))
    assert details.startswith("parameters.num_beams: a beam search's hypotheses are only known at its end")
    for body, field in (({"num_beams": 4, "stream": True}, "num_beams"), ({"num_beams": 0}, "num_beams"),
                        ({"num_beams": 100}, "num_beams"), ({"prompt": ""}, "prompt"),
                        ({"early_stopping": "sometimes"}, "early_stopping")):
        answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60,
                            json={"model": "marian", "prompt": "ok", "max_tokens": 4, **body})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == field, answer.text


@pytest.mark.parametrize("name", ["marian", "marian-two-vocabs"])
def test_tokenize_answers_the_source_tokens_with_offsets(server: ServerProcess, packages: dict[str, Path],
                                                         name: str) -> None:
    """/tokenize of an encoder-decoder: the source ids generation would run (the source tokenizer's, </s> marked
    special), each with its characters of the prompt."""
    source, _ = _tokenizers(packages[name])
    text = "translation, at last!"
    want = source.encode(text)
    answer = httpx.post(f"{server.http_url}/tokenize", json={"model": name, "prompt": text}, timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"] == want.ids and body["offsets"] == [list(o) for o in want.offsets]
    assert body["special"] == [bool(m) for m in want.special_tokens_mask] and body["special"][-1]


def test_two_generation_instances_answer_greedy_and_beams_as_transformers(packages: dict[str, Path]) -> None:
    """--generation-instances 2 (each engine its own encoder and decoder sessions, cross buffers and slots):
    greedy requests and beam searches sent together go to both engines (the least loaded first; the in-place
    decoder's test pins that routing) and answer as transformers' generate on a padded batch."""
    repository = packages["marian"].parent.parent
    args = ["--max-sequences", "4", "--generation-instances", "2", "--intra-op-threads", "1", "--metrics-port", "0"]
    with ServerProcess(repository, args) as server, OrtserveClient(server.address, timeout=60) as client:
        assert server.metric("ortserve_cache_slots", model="t5", state="total") == 8
        for name in ("marian", "t5"):
            with ThreadPoolExecutor(2 * len(SOURCES)) as pool:
                greedy = [pool.submit(client.generate, s, name, max_new_tokens=NEW) for s in SOURCES]
                beams = [pool.submit(client.generate, s, name, max_new_tokens=NEW, num_beams=4) for s in SOURCES]
                got = [[t.token_id for t in f.result().tokens] for f in greedy]
                got_beams = [[t.token_id for t in f.result().tokens] for f in beams]
            assert got == _hf_generate(name, packages[name], SOURCES, do_sample=False, num_beams=1), name
            assert got_beams == _hf_generate(name, packages[name], SOURCES, do_sample=False, num_beams=4), name


@pytest.mark.parametrize("early_stopping", [True, "never"])
def test_extreme_length_penalties_answer_instead_of_failing(client: OrtserveClient, server: ServerProcess,
                                                            early_stopping) -> None:
    """A length penalty whose power overflows (or underflows) a float ranks hypotheses at -0.0 (or -inf) instead of
    failing the search; every finite value answers on both doors."""
    for penalty in (1000.0, 1e10, 1e300, 3.4e38, -1e300):
        answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60, json={
            "model": "marian", "prompt": SOURCES[0], "max_tokens": NEW, "num_beams": 4,
            "length_penalty": penalty, "early_stopping": early_stopping})
        assert answer.status_code == 200, (penalty, answer.text)
        assert answer.json()["usage"]["completion_tokens"] >= 1
    result = client.generate(SOURCES[1], "marian", max_new_tokens=NEW, num_beams=4, length_penalty=3.4e38,
                             early_stopping=early_stopping if early_stopping is True else "never")
    assert result.tokens


def test_echo_and_prompt_scores_are_refused_by_name_before_compute(client: OrtserveClient,
                                                                  server: ServerProcess) -> None:
    """An encoder-decoder's prompt is its source: an echo of it before the answer, or its tokens scored, would mix
    the source's text with the target's tokens (text != the joined tokens). Refused naming the field, on both doors
    and in both modes, before any compute."""
    for body, field in (({"echo": True}, "echo"), ({"echo": True, "logprobs": 2}, "echo"),
                        ({"echo": True, "stream": True}, "echo"),
                        ({"prompt_logprobs": 2}, "parameters.prompt_logprobs")):   # refused where jobs are admitted
        answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60,
                            json={"model": "marian", "prompt": SOURCES[0], "max_tokens": 4, **body})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == field, answer.text
    details = _grpc_refusal(lambda: client.generate(SOURCES[0], "marian", max_new_tokens=4, prompt_logprobs=2))
    assert details.startswith("parameters.prompt_logprobs: an encoder-decoder's prompt is its source")
