"""Translation packages served by a real server process with a target language per request: random Hugging Face
M2M100 and mBART checkpoints with language tokens in their tokenizers (testing/translation_checkpoints.py),
exported by the exporter; greedy and beam-4 answers through gRPC Generate and /v1/completions with
`target_language` equal `transformers` generate with forced_bos_token_id = that language's token on a padded
batch; an unknown language, and any language for a model without languages, is refused naming the field."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from clients.errors import OrtserveError
from tests.server_process import ROOT, ServerProcess

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!"]
NEW = 9


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from testing import seq2seq_checkpoints, translation_checkpoints

    root = tmp_path_factory.mktemp("translation-serving")
    return {**translation_checkpoints.export_repository(root, ("m2m100", "mbart")),
            **seq2seq_checkpoints.export_repository(root, ("bart",))}     # a model without languages


@pytest.fixture(scope="module")
def served(packages: dict[str, Path]):
    """The server process on the repository of the three packages, and a client of its gRPC door."""
    args = ["--max-sequences", "8", "--http-port", "0", "--metrics-port", "0"]
    with ServerProcess(packages["m2m100"].parent.parent, args) as proc, \
            OrtserveClient(proc.address, timeout=60) as grpc_client:
        yield proc, grpc_client


@pytest.fixture(scope="module")
def server(served) -> ServerProcess:
    return served[0]


@pytest.fixture(scope="module")
def client(served) -> OrtserveClient:
    return served[1]


def _hf_generate(name: str, package: Path, sources: list[str], language: str, **kwargs) -> list[list[int]]:
    """transformers' generate on the sources as ONE right-padded batch with forced_bos_token_id = the language's
    token; each row's new ids up to its eos."""
    from testing.translation_checkpoints import hf_model, language_id

    model = hf_model(name)
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    rows = [tok.encode(s).ids for s in sources]
    width, pad = max(map(len, rows)), model.config.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                             forced_bos_token_id=language_id(name, language), **kwargs)
    eos = model.config.eos_token_id
    return [row[:row.index(eos) + 1] if eos in row else row for row in out[:, 1:].tolist()]


def _served(client: OrtserveClient, name: str, language: str, **params) -> list[list[int]]:
    with ThreadPoolExecutor(len(SOURCES)) as pool:       # sent together: encoded and decoded as one batch
        results = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=NEW, target_language=language,
                                                          **params), SOURCES))
    return [[t.token_id for t in r.tokens] for r in results]


def test_two_target_languages_of_m2m100_equal_transformers_forced_bos(client: OrtserveClient,
                                                                      packages: dict[str, Path]) -> None:
    from testing.translation_checkpoints import language_id

    answers = {}
    for language in ("__fr__", "__de__"):
        got = _served(client, "m2m100", language)
        assert got == _hf_generate("m2m100", packages["m2m100"], SOURCES, language)
        assert all(row[0] == language_id("m2m100", language) for row in got)
        answers[language] = got
    # The language steers the whole answer, not only its first token (else the check above says little).
    assert [a[1:] for a in answers["__fr__"]] != [a[1:] for a in answers["__de__"]]


@pytest.mark.parametrize("name,language", [("m2m100", "__de__"), ("mbart", "fr_XX"), ("mbart", "de_DE")])
def test_greedy_and_beams_with_a_target_language_equal_transformers(client: OrtserveClient, packages: dict[str, Path],
                                                                   name: str, language: str) -> None:
    assert _served(client, name, language) == _hf_generate(name, packages[name], SOURCES, language)
    assert _served(client, name, language, num_beams=4) == _hf_generate(name, packages[name], SOURCES, language,
                                                                        num_beams=4)


def test_completions_take_target_language_in_the_body(server: ServerProcess, packages: dict[str, Path]) -> None:
    tok = Tokenizer.from_file(str(packages["m2m100"] / "tokenizer.json"))
    for language in ("__fr__", "__de__"):
        want = _hf_generate("m2m100", packages["m2m100"], [SOURCES[2]], language)[0]
        for beams in (1, 4):
            answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60, json={
                "model": "m2m100", "prompt": SOURCES[2], "max_tokens": NEW, "temperature": 0,
                "target_language": language, "num_beams": beams})
            assert answer.status_code == 200, answer.text
            if beams == 1:
                assert answer.json()["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True)
            else:
                assert answer.json()["choices"][0]["text"] == tok.decode(
                    _hf_generate("m2m100", packages["m2m100"], [SOURCES[2]], language, num_beams=4)[0],
                    skip_special_tokens=True)


def test_the_cli_takes_the_languages_as_flags(server: ServerProcess, packages: dict[str, Path]) -> None:
    """`python -m clients generate --target-language` answers as transformers' forced_bos_token_id does; an unknown
    language is one readable line naming the field, exit 2."""
    tok = Tokenizer.from_file(str(packages["m2m100"] / "tokenizer.json"))
    base = [sys.executable, "-m", "clients", "--address", server.address, "--json", "generate", "--model", "m2m100",
            "--max-new-tokens", str(NEW)]
    for language in ("__fr__", "__de__"):
        run = subprocess.run([*base, "--target-language", language, SOURCES[2]], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        want = _hf_generate("m2m100", packages["m2m100"], [SOURCES[2]], language)[0]
        assert json.loads(run.stdout)["text"] == tok.decode(want, skip_special_tokens=True)
    bad = subprocess.run([*base, "--target-language", "fr_XX", SOURCES[2]], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "ortserve: error: INVALID_ARGUMENT: target_language: unknown language 'fr_XX' (this model's: __de__, __en__, "
        "__fr__)"]


def test_kserve_text_mode_takes_the_languages_as_parameters(client: OrtserveClient, server: ServerProcess) -> None:
    want = client.generate(SOURCES[0], "m2m100", max_new_tokens=NEW, target_language="__de__",
                           source_language="__fr__").text
    answer = httpx.post(f"{server.http_url}/v2/models/m2m100/infer", timeout=60, json={
        "inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": [SOURCES[0]]}],
        "parameters": {"max_new_tokens": NEW, "target_language": "__de__", "source_language": "__fr__"}})
    assert answer.status_code == 200, answer.text
    assert {o["name"]: o["data"] for o in answer.json()["outputs"]}["text"] == [want]


@pytest.mark.parametrize("model,language,message", [
    ("m2m100", "fr_XX", "target_language: unknown language 'fr_XX' (this model's: __de__, __en__, __fr__)"),
    ("mbart", "__fr__", "target_language: unknown language '__fr__' (this model's: de_DE, en_XX, fr_XX)"),
    ("bart", "fr_XX", "target_language: this bart model has no languages"),
])
def test_an_unknown_or_unsupported_language_is_refused_naming_the_field(client: OrtserveClient, server: ServerProcess,
                                                                         model: str, language: str,
                                                                         message: str) -> None:
    with pytest.raises(OrtserveError) as refused:
        client.generate("ok", model, max_new_tokens=4, target_language=language)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message.startswith(message), refused.value.message
    for body in ({"target_language": language}, {"target_language": language, "num_beams": 4}):
        answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60,
                            json={"model": model, "prompt": "ok", "max_tokens": 4, **body})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "target_language", answer.text
        assert answer.json()["error"]["message"].startswith(message), answer.text


def test_a_target_language_of_the_wrong_type_is_refused_naming_the_field(server: ServerProcess) -> None:
    for endpoint, body in (("completions", {"prompt": "ok"}),
                           ("chat/completions", {"messages": [{"role": "user", "content": "ok"}]})):
        answer = httpx.post(f"{server.http_url}/v1/{endpoint}", timeout=60,
                            json={"model": "m2m100", "max_tokens": 4, "target_language": 5, **body})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "target_language", answer.text


def test_source_language_replaces_the_tokenizers_default(client: OrtserveClient, server: ServerProcess,
                                                         packages: dict[str, Path]) -> None:
    """source_language "__de__" gives the answer of the source the tokenizer writes with src_lang __de__ (its ids
    sent as prompt_ids), equal to transformers' generate on them."""
    from testing.translation_checkpoints import hf_model, language_id, tokenizer

    ids = tokenizer("m2m100", source="__de__").encode(SOURCES[2]).ids
    assert ids[0] == language_id("m2m100", "__de__")
    with torch.no_grad():
        want = hf_model("m2m100").generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                           forced_bos_token_id=language_id("m2m100", "__fr__"))[0, 1:].tolist()
    want = want[:want.index(2) + 1] if 2 in want else want
    got = client.generate(SOURCES[2], "m2m100", max_new_tokens=NEW, target_language="__fr__", source_language="__de__",
                          logprobs=True)
    by_ids = client.generate(ids, "m2m100", max_new_tokens=NEW, target_language="__fr__", logprobs=True)
    assert [t.token_id for t in got.tokens] == [t.token_id for t in by_ids.tokens] == want
    assert [t.logprob for t in got.tokens] == [t.logprob for t in by_ids.tokens]
    assert got.usage.prompt_tokens == len(ids)
    # The source language changes the answer's scores (random weights repeat tokens, so ids alone may not differ).
    default = client.generate(SOURCES[2], "m2m100", max_new_tokens=NEW, target_language="__fr__", logprobs=True)
    assert max(abs(a.logprob - b.logprob) for a, b in zip(default.tokens[1:], got.tokens[1:])) > 1e-3
    answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60, json={
        "model": "m2m100", "prompt": SOURCES[2], "max_tokens": NEW, "temperature": 0, "target_language": "__fr__",
        "source_language": "__de__"})
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == got.text, answer.text
    for model, prompt, message in (
            ("m2m100", SOURCES[2], "source_language: unknown language 'xx'"),
            ("m2m100", [5, 6, 2], "source_language: only with a text prompt"),
            ("bart", "ok", "source_language: this bart model has no languages")):
        language = "xx" if message.endswith("'xx'") else "__de__"
        with pytest.raises(OrtserveError) as refused:
            client.generate(prompt, model, max_new_tokens=4, source_language=language)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message.startswith(message), refused.value.message
