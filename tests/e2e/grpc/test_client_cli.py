"""The `ortserve` CLI against a real server: readable and --json output, streaming, exit codes."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clients.__main__ import main
from tests.server_process import ROOT, ServerProcess, free_port, shared_server


@pytest.fixture(scope="module")
def address(tiny_repository: Path) -> str:
    server: ServerProcess = shared_server(tiny_repository)
    return server.address


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_classify_readable_and_json(address: str, capsys: pytest.CaptureFixture) -> None:
    text = "The king drew his sword before the castle"
    code, out, err = cli(capsys, "--address", address, "classify", text, "--model", "tiny-classifier")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("beta  0.") and lines[0].endswith(text)
    assert sorted(line.split()[0] for line in lines[1:]) == ["alpha", "beta", "gamma"]
    code, out, _ = cli(capsys, "--address", address, "--json", "classify", text, "--pair", "a river boat",
                       "--model", "tiny-classifier", "--top-k", "2")
    [result] = json.loads(out)
    assert code == 0 and set(result) == {"label", "score", "scores"} and len(result["scores"]) == 2


def test_fill_mask_readable(address: str, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = cli(capsys, "--address", address, "fill-mask", "the [MASK] sat on a boat",
                       "--model", "tiny-fill-mask", "--top-k", "2")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "the [MASK] sat on a boat"
    assert lines[1].startswith("    mask at token 2: ") and lines[2].startswith("    -> ")
    code, out, _ = cli(capsys, "--address", address, "--json", "fill-mask", "a [MASK]", "--model", "tiny-fill-mask")
    assert code == 0 and len(json.loads(out)[0]["masks"][0]["candidates"]) == 5


def test_generate_unary_stream_and_json_stream_agree(address: str, capsys: pytest.CaptureFixture) -> None:
    args = ["--address", address, "generate", "Once upon", "--model", "tiny-gpt", "--max-new-tokens", "6"]
    code, unary, err = cli(capsys, *args)
    assert code == 0 and err.startswith("[") and "generated tokens" in err
    code, streamed, _ = cli(capsys, *args, "--stream")
    assert code == 0 and streamed == unary  # text + newline in both
    code, out, _ = cli(capsys, "--json", *args, "--stream")
    chunks = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and chunks[-1]["final"] and "".join(c["text"] for c in chunks) + "\n" == unary
    code, out, _ = cli(capsys, "--json", *args)
    assert code == 0 and json.loads(out)["text"] + "\n" == unary


def test_generate_scores_the_prompt_as_offline(address: str, tiny_repository: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """--prompt-logprobs: the prompt's log-likelihood and perplexity on stderr, as one offline run computes them;
    with --json each prompt token with its logprob (the first has none)."""
    import math

    import onnxruntime as ort
    from tokenizers import Tokenizer

    from testing.offline import prompt_logprobs

    prompt = "Once upon a time there was a king who had three daughters"
    pkg = tiny_repository / "tiny-gpt" / "1"
    ids = Tokenizer.from_file(str(pkg / "tokenizer.json")).encode(prompt).ids
    want, _ = prompt_logprobs(ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"]),
                              json.loads((pkg / "model.json").read_text()), ids)
    args = ["--address", address, "generate", prompt, "--model", "tiny-gpt", "--max-new-tokens", "2"]
    for extra in ([], ["--stream"]):
        code, _, err = cli(capsys, *args, *extra, "--prompt-logprobs", "0")
        line = err.strip().splitlines()[-1]
        found = re.fullmatch(r"\[prompt: (\d+) tokens; log-likelihood (\S+) over the last (\d+), perplexity (\S+)\]", line)
        assert code == 0 and found, line
        assert (int(found[1]), int(found[3])) == (len(ids), len(ids) - 1)
        assert float(found[2]) == pytest.approx(sum(want), abs=1e-3)
        assert float(found[4]) == pytest.approx(math.exp(-sum(want) / len(want)), rel=1e-3)
    code, out, _ = cli(capsys, "--json", *args, "--prompt-logprobs", "2")
    scored = json.loads(out)["prompt_tokens"]
    assert code == 0 and [t["token_id"] for t in scored] == ids and scored[0]["logprob"] is None
    assert all(len(t["top_logprobs"]) == 2 for t in scored[1:])


def test_models_and_health(address: str, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = cli(capsys, "--address", address, "models")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NAME", "VERSION", "TASK", "STATE", "VARIANT", "REASON"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert sorted(rows) == ["tiny-classifier", "tiny-fill-mask", "tiny-gpt"]
    # the variant each loaded version runs: the manifests' CPU defaults (int8 for the classifier, fp32 the others)
    assert {n: r[4] for n, r in rows.items()} == {"tiny-classifier": "int8", "tiny-fill-mask": "fp32",
                                                  "tiny-gpt": "fp32"}
    assert cli(capsys, "--address", address, "health")[:2] == (0, "SERVING\n")
    code, out, _ = cli(capsys, "--address", address, "--json", "health", "tiny-gpt")
    assert code == 0 and json.loads(out) == {"model": "tiny-gpt", "status": "SERVING"}


@pytest.mark.parametrize("argv, code, message", [
    (["classify", "x", "--model", "no-such-model"], 1, "ortserve: error: NOT_FOUND: "),
    (["health", "no-such-model"], 1, "ortserve: error: NOT_FOUND: "),
    (["generate", "x", "--model", "tiny-gpt", "--top-p", "2"], 2, "ortserve: error: INVALID_ARGUMENT: parameters.top_p"),
    (["fill-mask", "no mask", "--model", "tiny-fill-mask"], 2, "ortserve: error: INVALID_ARGUMENT: texts[0]"),
    (["generate", "x", "--max-new-tokens", "0"], 2, "argument --max-new-tokens: expected an integer >= 1"),
    (["classify", "a", "b", "--pair", "c"], 2, "--pair: needs exactly one TEXT"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
])
def test_errors_are_one_line_with_exit_codes(address: str, capsys: pytest.CaptureFixture, argv: list[str],
                                             code: int, message: str) -> None:
    got, out, err = cli(capsys, "--address", address, *argv)
    assert got == code and out == ""
    assert len(err.splitlines()) == 1 and message in err


def test_real_entry_point_and_unreachable_server(address: str) -> None:
    ok = subprocess.run([sys.executable, "-m", "clients", "--address", address, "--json", "models"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and {m["name"] for m in json.loads(ok.stdout)} >= {"tiny-gpt"}
    down = subprocess.run([sys.executable, "-m", "clients", "--address", f"127.0.0.1:{free_port()}",
                           "--retries", "1", "models"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and down.stdout == ""
    assert down.stderr.startswith("ortserve: error: UNAVAILABLE: ") and len(down.stderr.splitlines()) == 1
