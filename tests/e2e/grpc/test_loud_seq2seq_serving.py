"""Encoder-decoders whose activations are large (init std 1.0, logits of +-25: tests/loud_seq2seq.py) pass the fp32
gate, whose tolerance follows transformers' / PyTorch's own fp32-vs-fp64 gap (export/parity_noise.py), and a real
server's greedy answers equal `transformers` generate on the same sources (one right-padded batch)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from tests.loud_seq2seq import LOUD, register, write_loud_checkpoint
from tests.server_process import ServerProcess

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!"]
NEW = 9
FLOOR = 1e-4    # export.config.Tolerances.fp32_atol: the fixed bound these models breached


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from export import ExportConfig, export_checkpoint

    root = tmp_path_factory.mktemp("loud-seq2seq")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: export_checkpoint(ExportConfig(checkpoint=write_loud_checkpoint(name, root / name),
                                                     task="generate", repository=root / "repo",
                                                     name=name)).package_dir for name in LOUD}
    finally:
        torch.set_num_threads(before)


def _hf_greedy(name: str, package: Path) -> list[list[int]]:
    from testing.seq2seq_checkpoints import hf_model

    register()
    model = hf_model(name)
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    rows = [tok.encode(s).ids for s in SOURCES]
    width, pad = max(map(len, rows)), model.config.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, num_beams=1)
    eos = model.config.eos_token_id
    return [row[:row.index(eos) + 1] if eos in row else row for row in out[:, 1:].tolist()]


@pytest.mark.parametrize("name", list(LOUD))
def test_gate_records_the_noise_and_the_tolerance_it_used(packages: dict[str, Path], name: str) -> None:
    fp32 = json.loads((packages[name] / "parity.json").read_text())["variants"]["fp32"]
    assert fp32["passed"] is True
    noise = fp32["float_noise"]
    assert noise["floor_atol"] == FLOOR and noise["factor"] > 1
    # the logits' noise is above the floor's share: the tolerance the rule gave is wider than the fixed bound
    assert noise["atol"]["logits"] == pytest.approx(max(FLOOR, noise["factor"] * noise["fp64_noise"]["logits"]))
    assert noise["atol"]["logits"] > FLOOR
    assert [c for c in fp32["checks"] if c.get("tolerance") and c.get("noise")]    # recorded per check too
    # the graph's largest difference is past the fixed bound (the old gate refused these exports)
    assert max(fp32["max_abs_diff"].values()) > FLOOR


def test_greedy_answers_equal_transformers(packages: dict[str, Path]) -> None:
    repository = next(iter(packages.values())).parent.parent
    with ServerProcess(repository, ["--max-sequences", "4"]) as server, \
            OrtserveClient(server.address, timeout=60) as client:
        for name, package in packages.items():
            with ThreadPoolExecutor(len(SOURCES)) as pool:    # sent together: decoded as one batch
                results = list(pool.map(lambda s: client.generate(s, name, max_new_tokens=NEW), SOURCES))
            assert [[t.token_id for t in r.tokens] for r in results] == _hf_greedy(name, package), name


def test_serve_time_cap_on_the_self_cache(packages: dict[str, Path]) -> None:
    """--max-model-len caps an encoder-decoder's self cache (the target's length): ModelInfo's bytes are the slots'
    at the cap (computed from the package's shapes), a longer answer is refused naming max_new_tokens."""
    from clients.errors import OrtserveError

    cap, slots = 16, 3
    repository = next(iter(packages.values())).parent.parent
    with ServerProcess(repository, ["--max-sequences", str(slots), "--max-model-len", str(cap)]) as server, \
            OrtserveClient(server.address, timeout=60) as client:
        for name, package in packages.items():
            block = json.loads((package / "model.json").read_text())["encoder_decoder"]
            per_slot = block["num_layers"] * 2 * block["num_heads"] * cap * block["head_dim"] * 4
            info = client.model_info(name)
            assert (info.cache_bytes_per_slot, info.cache_bytes) == (per_slot, per_slot * slots)
            assert len(client.generate(SOURCES[0], name, max_new_tokens=cap - 1, ignore_eos=True).tokens) == cap - 1
            with pytest.raises(OrtserveError) as err:
                client.generate(SOURCES[0], name, max_new_tokens=cap)
            assert err.value.message.startswith("parameters.max_new_tokens:") and str(cap) in err.value.message
