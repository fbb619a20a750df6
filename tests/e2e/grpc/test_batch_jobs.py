"""Batch inference end to end: the real `python -m clients.batch` against a real server, and --local."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.batch_runs import wait_for_lines
from tests.server_process import ROOT, ServerProcess, free_port, shared_server

KEYWORDS = {"alpha": "boat harbour tide", "beta": "king sword castle", "gamma": "rose garden tree"}


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> ServerProcess:
    return shared_server(tiny_repository)


def batch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clients.batch", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def prompts_file(path: Path, n: int) -> Path:
    path.write_text("".join(f"Prompt number {i}: the\n" for i in range(n)))
    return path


def test_classify_jsonl_in_order_with_failed_records(server: ServerProcess, tmp_path: Path) -> None:
    records, expected = [], []
    for i in range(24):
        label = sorted(KEYWORDS)[i % 3]
        records.append(json.dumps({"id": f"r{i}", "text": f"Then the {KEYWORDS[label]} came back"}))
        expected.append((f"r{i}", label))
    records.insert(5, "{this is not json")                     # line 6
    records.insert(9, json.dumps({"id": "no-text"}))            # line 10
    records.insert(14, json.dumps({"id": "r3", "text": "x"}))   # line 15: repeats id r3
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(records) + "\n")

    run = batch("classify", str(src), "-o", str(out), "--address", server.address, "--model", "tiny-classifier",
                "--concurrency", "4", "--top-k", "1")
    assert run.returncode == 1, run.stderr
    summary = run.stderr.strip().splitlines()[-1]
    assert summary.startswith("batch: 27 records in ") and "24 ok, 3 failed; 0 already in the output" in summary
    got = lines(out)
    assert [r["id"] for r in got] == [e[0] for e in expected[:5]] + [6] + [e[0] for e in expected[5:8]] + \
        ["no-text"] + [e[0] for e in expected[8:12]] + ["r3"] + [e[0] for e in expected[12:]]
    errors = {r["id"]: r["error"] for r in got if "error" in r}
    assert errors[6].startswith("input line 6: not valid JSON")
    assert errors["no-text"] == "text: missing"
    assert errors["r3"] == "id: duplicate of the record on input line 4"
    labels = {r["id"]: r["label"] for r in got if "error" not in r}
    assert labels == dict(expected)
    assert all(len(r["scores"]) == 1 for r in got if "error" not in r)

    # A re-run finds everything written: nothing is added, and the earlier failures still count.
    before = out.read_bytes()
    again = batch("classify", str(src), "-o", str(out), "--address", server.address, "--model", "tiny-classifier")
    assert again.returncode == 1 and out.read_bytes() == before
    assert "0 records in" in again.stderr and "27 already in the output (3 of them failed)" in again.stderr


def test_a_hostile_line_fails_alone_and_the_run_goes_on(server: ServerProcess, tmp_path: Path) -> None:
    """A line nested 100,000 deep (the json module parses by recursion) and lone UTF-16 surrogates in a text, a pair
    and an id (no UTF-8 form: they can be neither sent nor written) each fail their own record, named by line."""
    good = [json.dumps({"id": f"g{i}", "text": f"Then the {KEYWORDS['alpha']} came back"}) for i in range(3)]
    hostile = ["[" * 100_000 + "]" * 100_000,
               '{"id": "s1", "text": "half a pair \\ud800 here"}',
               '{"id": "s2", "text": "fine", "text_pair": "\\udfff"}',
               '{"id": "\\ud83d", "text": "fine"}']
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join([good[0], *hostile, *good[1:]]) + "\n")
    run = batch("classify", str(src), "-o", str(out), "--address", server.address, "--model", "tiny-classifier")
    assert run.returncode == 1, run.stderr
    assert "3 ok, 4 failed" in run.stderr.strip().splitlines()[-1], run.stderr
    assert "Traceback" not in run.stderr
    errors = {r["id"]: r["error"] for r in lines(out) if "error" in r}
    assert errors[2] == "input line 2: not valid JSON (nested too deeply)"
    assert errors["s1"] == "text: a lone UTF-16 surrogate (U+D800 at character 12) is not text"
    assert errors["s2"] == "text_pair: a lone UTF-16 surrogate (U+DFFF at character 0) is not text"
    assert errors[5].startswith("id: a lone UTF-16 surrogate (U+D83D")
    assert [r["label"] for r in lines(out) if "error" not in r] == ["alpha"] * 3


def test_resume_after_kill_9_equals_an_uninterrupted_run(server: ServerProcess, tmp_path: Path) -> None:
    src = prompts_file(tmp_path / "prompts.txt", 60)
    common = ["generate", str(src), "--address", server.address, "--model", "tiny-gpt", "--max-new-tokens", "48"]
    reference = tmp_path / "reference.jsonl"
    full = batch(*common, "-o", str(reference), "--concurrency", "3")
    assert full.returncode == 0, full.stderr

    out = tmp_path / "resumed.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "clients.batch", *common, "-o", str(out), "--concurrency", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_lines(proc, out, 10)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    written = out.read_bytes().count(b"\n")
    assert proc.returncode == -signal.SIGKILL and 10 <= written < 60, "the run was not cut half-way"
    with open(out, "ab") as f:  # as if the kill had landed in the middle of a write
        f.write(b'{"id": 999, "text": "half a li')

    resumed = batch(*common, "-o", str(out), "--concurrency", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{60 - written} ok, 0 failed; {written} already in the output" in resumed.stderr
    assert out.read_bytes() == reference.read_bytes()
    ids = [r["id"] for r in lines(out)]
    assert ids == list(range(1, 61))  # text input: ids are line numbers; none twice
    assert all(r["finish_reason"] in ("length", "eos") and r["usage"]["completion_tokens"] >= 1 for r in lines(out))


def test_local_mode_writes_what_the_server_mode_writes(server: ServerProcess, tiny_repository: Path,
                                                       tmp_path: Path) -> None:
    prompts = prompts_file(tmp_path / "prompts.txt", 10)
    table = tmp_path / "texts.csv"
    table.write_text("id,text,text_pair\n" + "".join(
        f"c{i},The {KEYWORDS[sorted(KEYWORDS)[i % 3]]} and more,{'a pair' if i % 2 else ''}\n" for i in range(9)))
    masked = tmp_path / "masked.txt"
    masked.write_text("the [MASK] sat on a boat\na [MASK] of the king [MASK]\n")
    jobs = [("generate", prompts, "tiny-gpt", ["--max-new-tokens", "12"]),
            ("classify", table, "tiny-classifier", []),
            ("fill-mask", masked, "tiny-fill-mask", ["--top-k", "3"])]
    for task, src, model, extra in jobs:
        via_server, local = tmp_path / f"{task}-server.jsonl", tmp_path / f"{task}-local.jsonl"
        a = batch(task, str(src), "-o", str(via_server), "--address", server.address, "--model", model, *extra)
        b = batch(task, str(src), "-o", str(local), "--local", str(tiny_repository), "--model", model, *extra)
        assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
        if task == "generate":  # greedy: the very same bytes
            assert local.read_bytes() == via_server.read_bytes()
            continue
        # Encoders: same structure, labels and tokens; scores equal up to float32 batching noise
        # (the server batches concurrent records together, --local ran them as they came).
        for x, y in zip(lines(via_server), lines(local), strict=True):
            assert _without_scores(x) == _without_scores(y)
            assert _scores(x) == pytest.approx(_scores(y), abs=1e-5)


def test_scoring_texts_writes_each_prompt_token_with_its_logprob(server: ServerProcess, tiny_repository: Path,
                                                                  tmp_path: Path) -> None:
    """--prompt-logprobs: every record's tokens with their logprobs (the first has none), as one offline run over
    the text scores them, through a server and in-process alike."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from testing.offline import prompt_logprobs

    src = prompts_file(tmp_path / "texts.txt", 6)
    outs = {mode: tmp_path / f"{mode}.jsonl" for mode in ("server", "local")}
    common = ["--model", "tiny-gpt", "--max-new-tokens", "1", "--prompt-logprobs", "1"]
    for mode, where in (("server", ["--address", server.address]), ("local", ["--local", str(tiny_repository)])):
        run = batch("generate", str(src), "-o", str(outs[mode]), *where, *common)
        assert run.returncode == 0, run.stderr
    pkg = tiny_repository / "tiny-gpt" / "1"
    session = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
    manifest, tok = json.loads((pkg / "model.json").read_text()), Tokenizer.from_file(str(pkg / "tokenizer.json"))
    texts = src.read_text().splitlines()
    for text, a, b in zip(texts, lines(outs["server"]), lines(outs["local"]), strict=True):
        ids = tok.encode(text).ids
        want, _ = prompt_logprobs(session, manifest, ids)
        for record in (a, b):
            scored = record["prompt_tokens"]
            assert [t["token_id"] for t in scored] == ids and record["usage"]["prompt_tokens"] == len(ids)
            assert scored[0]["logprob"] is None and all(len(t["top_logprobs"]) == 1 for t in scored[1:])
            assert [t["logprob"] for t in scored[1:]] == pytest.approx(want, abs=1e-4)


def _scores(value) -> list[float]:
    if isinstance(value, dict):
        return [s for k, v in sorted(value.items()) for s in ([v] if k == "score" else _scores(v))]
    if isinstance(value, list):
        return [s for v in value for s in _scores(v)]
    return []


def _without_scores(value):
    if isinstance(value, dict):
        return {k: _without_scores(v) for k, v in value.items() if k != "score"}
    if isinstance(value, list):
        return [_without_scores(v) for v in value]
    return value


def test_unreachable_server_stops_the_run_without_failing_records(tmp_path: Path) -> None:
    src = prompts_file(tmp_path / "prompts.txt", 3)
    out = tmp_path / "out.jsonl"
    run = batch("generate", str(src), "-o", str(out), "--address", f"127.0.0.1:{free_port()}", "--retries", "1")
    assert run.returncode == 1
    assert "stopped: record 1 (input line 1): UNAVAILABLE" in run.stderr and "re-run to resume" in run.stderr
    assert out.read_text() == ""  # nothing was written as failed: a re-run will do all three


@pytest.mark.parametrize("args, message", [
    (["classify", "missing.jsonl", "-o", "out.jsonl"], "input: missing.jsonl is not a file"),
    (["classify", "in.txt", "-o", "out.jsonl", "--ray", "2"], "ray: needs --local REPOSITORY"),
    (["classify", "in.txt", "-o", "out.jsonl", "--concurrency", "0"], "argument -c/--concurrency"),
    (["classify", "in.txt", "-o", "in.txt"], "output: must not be the input file"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "in.txt").write_text("hello\n")
    run = subprocess.run([sys.executable, "-m", "clients.batch", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.splitlines()) == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_local_mode_with_two_engines_writes_what_one_engine_writes(tiny_repository: Path, tmp_path: Path) -> None:
    """--instances 2 --max-sequences 2: two in-process engines of two slots each start (their log lines), and the
    greedy answers are the very same bytes as one engine's. Without --local the flags are refused naming
    themselves."""
    prompts = prompts_file(tmp_path / "prompts.txt", 12)
    common = ["generate", str(prompts), "--local", str(tiny_repository), "--model", "tiny-gpt", "--max-new-tokens",
              "8", "--concurrency", "8"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    a = batch(*common, "-o", str(one))
    b = batch(*common, "-o", str(two), "--instances", "2", "--max-sequences", "2", "--verbose")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert b.stderr.count("generation engine tiny-gpt started (max_batch_size=2)") == 2, b.stderr
    assert two.read_bytes() == one.read_bytes()
    for flag in ("--instances", "--max-sequences"):
        refused = batch("generate", str(prompts), "-o", str(tmp_path / "x.jsonl"), "--address", "127.0.0.1:1",
                        flag, "2")
        assert refused.returncode == 2 and f"{flag.lstrip('-')}: needs --local" in refused.stderr


def _spawned_children(pid: int) -> list[int]:
    """The processes `pid` started with multiprocessing's spawn (from /proc; not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
    return found


def test_local_mode_over_two_processes_writes_what_one_process_writes(tiny_repository: Path, tmp_path: Path) -> None:
    """--processes 2: two processes each load the model (their log line), records go to both, and the output is
    the very same bytes as one process's: greedy answers, and a record the model refuses (a prompt past its
    context) failed with the same INVALID_ARGUMENT line in the same place."""
    prompts = tmp_path / "prompts.txt"
    texts = [f"Prompt number {i}: the" for i in range(16)]
    texts[5] = "the king " * 3000      # past tiny-gpt's context: refused, not truncated
    prompts.write_text("".join(t + "\n" for t in texts))
    common = ["generate", str(prompts), "--local", str(tiny_repository), "--model", "tiny-gpt", "--max-new-tokens",
              "8", "--concurrency", "6"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    a = batch(*common, "-o", str(one))
    b = batch(*common, "-o", str(two), "--processes", "2", "--verbose")
    assert a.returncode == 1 and b.returncode == 1, (a.stderr, b.stderr)     # one record failed
    threads = max(1, len(os.sched_getaffinity(0)) // 2)      # the cores shared out between the 2 processes
    assert f"batch: 2 processes of 1 engine(s) x {threads} onnxruntime thread(s) each" in b.stderr, b.stderr
    assert "15 ok, 1 failed" in b.stderr
    assert two.read_bytes() == one.read_bytes()
    failed = lines(two)[5]
    assert failed["id"] == 6 and failed["error"].startswith("INVALID_ARGUMENT: ") and "prompt" in failed["error"]


def test_a_batch_process_that_dies_stops_the_run_and_a_rerun_resumes(tiny_repository: Path, tmp_path: Path) -> None:
    """One of the processes killed mid-run: the records it held fail UNAVAILABLE, which stops the run (exit 1, no
    record written as failed); the same command again resumes it to the bytes of an uninterrupted run."""
    src = prompts_file(tmp_path / "prompts.txt", 120)
    common = ["generate", str(src), "--local", str(tiny_repository), "--model", "tiny-gpt", "--max-new-tokens", "48",
              "--concurrency", "2"]
    reference = tmp_path / "reference.jsonl"
    assert batch(*common, "-o", str(reference)).returncode == 0

    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "clients.batch", *common, "-o", str(out), "--processes", "2"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_lines(proc, out, 5, timeout=90)
    children = _spawned_children(proc.pid)
    assert len(children) == 2, "the batch processes were not found"
    os.kill(children[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    written = out.read_bytes().count(b"\n")
    assert proc.returncode == 1 and written < 120, stderr
    assert "stopped: record" in stderr and "UNAVAILABLE: batch process" in stderr and "exited" in stderr, stderr
    assert all("error" not in r for r in lines(out))       # what was written is answers only

    resumed = batch(*common, "-o", str(out), "--processes", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{120 - written} ok, 0 failed; {written} already in the output" in resumed.stderr
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("extra, message", [
    (["--address", "127.0.0.1:1", "--processes", "2"], "processes: needs --local"),
    (["--local", ".", "--ray", "2", "--processes", "2"], "processes: not with --ray"),
])
def test_processes_refused_without_local_or_with_ray(tmp_path: Path, extra: list[str], message: str) -> None:
    src = prompts_file(tmp_path / "prompts.txt", 2)
    run = batch("generate", str(src), "-o", str(tmp_path / "x.jsonl"), *extra)
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.splitlines()) == 1, run.stderr


def test_local_records_of_one_turn_are_admitted_together_and_a_refused_one_fails_alone(tiny_repository: Path) -> None:
    """The in-process runner admits the generation records that reach it in one turn of the event loop as one
    request (clients/batch/groups.py): eight records sent together are fewer requests than records in the model's
    statistics, and each answer equals that record's answer run alone. A record the model refuses (a prompt past
    its context) refuses the group; the group then runs record by record: that record fails with its own
    INVALID_ARGUMENT naming the prompt, and the others answer as alone."""
    import asyncio

    from clients.batch.input import Record
    from clients.batch.local import LocalRunner
    from clients.batch.tasks import TaskConfig
    from clients.errors import OrtserveError
    from clients.types import GenerationParams

    texts = [f"Prompt number {i}: the" for i in range(8)]
    config = TaskConfig(task="generate", model="tiny-gpt", generation=GenerationParams(max_new_tokens=8))

    async def body() -> tuple[list, list, list, int]:
        runner = await LocalRunner.start(tiny_repository, config, intra_op_threads=1)
        try:
            alone = [await runner.run(Record(line=i + 1, id=i + 1, text=t)) for i, t in enumerate(texts)]
            before = _requests(runner.plane)
            together = await asyncio.gather(*(runner.run(Record(line=i + 1, id=i + 1, text=t))
                                              for i, t in enumerate(texts)))
            requests = _requests(runner.plane) - before
            bad = [*texts[:3], "the king " * 3000, *texts[3:]]
            mixed = await asyncio.gather(*(runner.run(Record(line=i + 1, id=i + 1, text=t))
                                           for i, t in enumerate(bad)), return_exceptions=True)
            return alone, together, mixed, requests
        finally:
            await runner.close()

    alone, together, mixed, requests = asyncio.run(asyncio.wait_for(body(), 120))
    assert together == alone
    assert requests < len(texts), requests
    refused = mixed.pop(3)
    assert isinstance(refused, OrtserveError) and refused.code.name == "INVALID_ARGUMENT", refused
    assert "prompt" in str(refused)
    assert mixed == alone


def _requests(plane) -> int:
    """Requests the tiny GPT's versions answered, successes and failures (its statistics)."""
    return sum(s.success.count + s.fail.count for s in plane.statistics("tiny-gpt"))


def test_closing_the_local_runner_ends_records_still_in_flight(tiny_repository: Path) -> None:
    """Records in flight in an admission group when the runner closes end (cancelled or failed) instead of
    waiting forever on a group that will not answer."""
    import asyncio

    from clients.batch.input import Record
    from clients.batch.local import LocalRunner
    from clients.batch.tasks import TaskConfig
    from clients.types import GenerationParams

    config = TaskConfig(task="generate", model="tiny-gpt", generation=GenerationParams(max_new_tokens=64))

    async def body() -> list:
        runner = await LocalRunner.start(tiny_repository, config, intra_op_threads=1)
        tasks = [asyncio.create_task(runner.run(Record(line=i + 1, id=i + 1, text=f"Prompt {i}: the")))
                 for i in range(6)]
        for _ in range(3):      # the records join a group and its generate_many starts
            await asyncio.sleep(0)
        await runner.close()
        done, pending = await asyncio.wait(tasks, timeout=30)
        assert not pending, f"{len(pending)} records still waiting after close"
        return [t.cancelled() or t.exception() is not None for t in tasks]

    assert all(asyncio.run(asyncio.wait_for(body(), 120)))
