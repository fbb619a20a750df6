"""Every command line fails on an OS error (a full disk, a path under a file, an unreadable file) with ONE
line on stderr and a non-zero exit, never a traceback; and the README's batch commands run exactly as written.

The disk-full cases use a real full filesystem: a 256 KiB tmpfs mounted for the test (needs root, as in CI's
container; skipped with the reason otherwise) or /dev/full.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from tests.server_process import ROOT, ServerProcess

CLASSIFIER = "tiny-classifier"
TEXTS = ["the boat left the harbour", "the king took the throne", "a rose in the garden"]


def run_cli(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
            stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd or ROOT, env={**os.environ, **(env or {})}, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    return lines[0]


def script(name: str) -> list[str]:
    """A console script of this checkout's environment, else the module it runs."""
    found = Path(sys.executable).parent / name
    modules = {"ortserve": "clients", "ortserve-batch": "clients.batch"}
    return [str(found)] if found.exists() else [sys.executable, "-m", modules[name]]


@pytest.fixture()
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A real, small, full filesystem (tmpfs of 256 KiB, filled)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip() or made.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(mount: Path) -> None:
    try:
        with open(mount / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass


@pytest.fixture(scope="module")
def genre_server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("cli") / "model_repository"
    shutil.copytree(tiny_repository / CLASSIFIER, repo / "genre")  # the README's model name
    with ServerProcess(repo) as proc:
        proc.repo = repo  # type: ignore[attr-defined]
        yield proc


# ---------------------------------------------------------------------------- OS errors, one line each


def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(tiny_checkpoints, full_fs: Path) -> None:
    result = run_cli([sys.executable, "-m", "export", str(tiny_checkpoints.classifier), "--task", "classify",
                      "--repository", str(full_fs), "--name", "full"])
    line = one_line_error(result)
    assert "No space left on device" in line, line
    left = [p for p in full_fs.rglob("*") if p.is_file()]
    assert not left, f"a failed export left files behind: {left}"


def test_export_pipeline_and_training_under_a_file_are_one_line(tiny_checkpoints, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    export = run_cli([sys.executable, "-m", "export", str(tiny_checkpoints.classifier), "--task", "classify",
                      "--repository", str(a_file / "repo"), "--name", "x"])
    assert "Not a directory" in one_line_error(export)
    pipeline = run_cli([sys.executable, "-m", "pipeline", "--workdir", str(a_file / "work"),
                        "--repository", str(a_file / "repo")])
    assert "Not a directory" in one_line_error(pipeline)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the boat left the harbour at dawn\n" * 50)
    training = run_cli([sys.executable, "-m", "training", "tokenizer", "--kind", "wordpiece", "--corpus", str(corpus),
                        "--vocab-size", "300", "--out", str(a_file / "tok"), "--quiet"])
    line = one_line_error(training)   # mkdir of the parents says "File exists" about the file in the way
    assert line.startswith("error: ") and str(a_file) in line


def test_the_moved_deploy_command_is_one_line_naming_the_pipeline(tmp_path: Path) -> None:
    result = run_cli([sys.executable, "-m", "clients.deploy", "--workdir", str(tmp_path / "w"),
                      "--repository", str(tmp_path / "r")])
    assert result.returncode == 2 and "python -m pipeline" in one_line_error(result)
    assert list(tmp_path.iterdir()) == []  # it ran nothing


def test_server_with_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    """/proc/self/mem is a regular file that fails to read (EIO): a certificate that cannot be read."""
    result = run_cli([sys.executable, "-m", "server", "--repository", str(tmp_path), "--tls-cert", "/proc/self/mem",
                      "--tls-key", "/proc/self/mem"])
    assert re.match(r"ortserve-server: error: .*Input/output error", one_line_error(result)), result.stderr


def test_client_cli_writing_to_a_full_disk_is_one_line(genre_server: ServerProcess) -> None:
    with open("/dev/full", "w") as full:
        result = run_cli([*script("ortserve"), "--address", genre_server.address, "classify", "--model", "genre",
                          *TEXTS], stdout=full.fileno())
    assert "No space left on device" in one_line_error(result)


def test_batch_writing_to_a_full_disk_is_one_line(genre_server: ServerProcess, full_fs: Path, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(TEXTS * 50) + "\n")
    fill(full_fs)
    result = run_cli([*script("ortserve-batch"), "classify", str(lines), "-o", str(full_fs / "out.jsonl"),
                      "--model", "genre", "--address", genre_server.address, "--no-progress"])
    assert "No space left on device" in one_line_error(result)


# ---------------------------------------------------------------------------- the README's batch commands


def readme_batch_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## For batch-inference jobs"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [line.split("#")[0].strip() for line in block.splitlines() if "ortserve-batch" in line]


def test_the_readme_batch_commands_run_as_written(genre_server: ServerProcess, tmp_path: Path) -> None:
    commands = readme_batch_commands()
    assert len(commands) == 2 and any("--local model_repository" in c for c in commands), commands
    work = tmp_path / "work"
    shutil.copytree(genre_server.repo, work / "model_repository")  # type: ignore[attr-defined]
    (work / "lines.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == ".venv/bin/ortserve-batch", argv
        result = run_cli([*script("ortserve-batch"), *argv[1:], "--no-progress"], cwd=work,
                         env={"ORTSERVE_ADDRESS": genre_server.address})
        assert result.returncode == 0, (command, result.stderr)
        records = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
        assert [r["id"] for r in records] == [0, 1, 2] and all("label" in r for r in records), (command, records)
        (work / "out.jsonl").unlink()
