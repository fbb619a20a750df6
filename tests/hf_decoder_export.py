"""The served decoder tests' setup: `transformers` models saved with the tiny GPT-2 checkpoint's tokenizer, exported by
the command line (`python -m export --task generate`) as a user would, and a real server on the repository."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from tokenizers import Tokenizer

from testing.launch import ROOT
from tests.server_process import ServerProcess

SERVER_ARGS = ("--max-sequences", "4", "--prefill-chunk-tokens", "4")


def export_hf_decoder(hf, name: str, tokenizer_dir: Path, root: Path) -> Path:
    """Save `hf` to root/name with tokenizer_dir's tokenizer*/special_tokens* files and export it into root/"repo"
    under `name`; returns the repository. Fails the test with the exporter's stderr."""
    return export_hf_decoders({name: hf}, tokenizer_dir, root)


def export_hf_decoders(models: dict[str, Any], tokenizer_dir: Path, root: Path, variants: str = "fp32") -> Path:
    """export_hf_decoder for each {name: model} (`variants` as the command line's --variants), the command lines
    running side by side: each is mostly its own interpreter's imports and a one-thread export, and each publishes
    under its own name (its own staging folder)."""
    procs = {}
    for name, hf in models.items():
        ckpt = root / name
        hf.save_pretrained(ckpt)
        for f in tokenizer_dir.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                (ckpt / f.name).write_bytes(f.read_bytes())
        procs[name] = subprocess.Popen([sys.executable, "-m", "export", str(ckpt), "--task", "generate",
                                        "--repository", str(root / "repo"), "--name", name, "--variants", variants],
                                       cwd=ROOT,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors = {}
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            errors[name] = stderr
    assert not errors, errors
    return root / "repo"


@contextmanager
def serve_hf_decoders(build: Callable[[int, int], dict[str, Any]], tokenizer_dir: Path, root: Path,
                      extra_args: tuple[str, ...] = ()) -> Iterator[tuple[ServerProcess, Path, dict[str, Any], Tokenizer]]:
    """build(vocab_size, end-of-text id) -> {package name: transformers model}; each is exported, then one server
    (4 sequences, prompts prefilled in chunks of 4) serves them all. Yields (server, repository, models, tokenizer)."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    models = build(tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"))
    export_hf_decoders(models, tokenizer_dir, root)
    with ServerProcess(root / "repo", [*SERVER_ARGS, *extra_args]) as server:
        yield server, root / "repo", models, tok
