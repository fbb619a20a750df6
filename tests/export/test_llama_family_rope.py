"""Issue 39: rope scaling (linear, dynamic, yarn, longrope, llama3), partial rotary, Qwen3 (q/k norm, own head_dim),
SmolLM3 (NoPE layers) and Phi-3 (fused q|k|v and gate|up) in the Llama-family decoder, against `transformers`.

Every reference is transformers' own model built from a random tiny config: our PyTorch model on left-padded
batches (and our checkpoint back in transformers); the exported in-place graph (through the parity gate) driven as
the engine drives it — rows of different lengths in one prefill, decoding together, a slot reused, a prompt
prefilled in chunks — and greedy ids equal to transformers' generate. Scaled rope types set
original_max_position_embeddings to 16 and run sequences well past it. What a static table cannot serve as
transformers does is refused by name."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.parity_inplace import SlotDriver
from testing.offline import greedy_inplace
from tests.llama_models import EXPORTED, FAMILIES, ROPE, SIZES, VOCAB, hf_model

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def _hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0].numpy()


def _seq(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_pytorch_model_equals_transformers_left_padded_past_the_original_length(tmp_path: Path, name: str) -> None:
    from training.checkpoint import load_model, save_model

    hf = hf_model(name)
    hf.save_pretrained(tmp_path / "hf")
    ours, config = load_model(tmp_path / "hf")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (3, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :9], mask[2, :25] = 0, 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got, _ = ours.eval()(ids, mask)
    real = mask.bool()
    assert float((ref - got).abs()[real].max()) <= 1e-5
    save_model(ours, tmp_path / "ours")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(back).__name__ == type(hf).__name__ and config.model_type == hf.config.model_type
    back.config._attn_implementation = "eager"
    with torch.no_grad():
        again = back.eval()(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert float((again - got).abs()[real].max()) <= 1e-5


def test_longrope_switches_to_long_factors_per_call_as_transformers(tmp_path: Path) -> None:
    """Past original_max_position_embeddings transformers rotates a whole call with the long factors: so does our
    model (the export refuses such lengths, test_what_a_static_table_cannot_serve_is_refused)."""
    from training.checkpoint import load_model

    hf = hf_model("phi3-partial-longrope", original_max_position_embeddings=16)
    hf.save_pretrained(tmp_path)
    ours, _ = load_model(tmp_path)
    ids = torch.tensor([_seq(30, 1)])
    with torch.no_grad():
        short, long_ = hf(input_ids=ids[:, :16]).logits, hf(input_ids=ids).logits
        assert float((ours.eval()(ids[:, :16])[0] - short).abs().max()) <= 1e-5
        assert float((ours(ids)[0] - long_).abs().max()) <= 1e-5
        assert float((long_[:, :16] - short).abs().max()) > 1e-3   # the factors did switch


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.conftest import tiny_corpus, one_torch_thread
    from export import ExportConfig, export_checkpoint
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("llama-family")
    tok = train_tokenizer(tiny_corpus(), TokenizerConfig(kind="bpe", vocab_size=VOCAB, min_frequency=1))
    tok_dir = save_tokenizer(tok, root / "tok", "bpe", 62)
    models = {}
    with one_torch_thread():
        for name in EXPORTED:
            hf = hf_model(name, vocab_size=tok.get_vocab_size())
            hf.save_pretrained(root / name)
            for f in tok_dir.iterdir():
                (root / name / f.name).write_bytes(f.read_bytes())
            r = export_checkpoint(ExportConfig(checkpoint=root / name, task="generate", repository=root / "repo",
                                               name=name))
            assert r.parity["passed"] and all(c["passed"] for c in r.parity["variants"]["fp32"]["checks"])
            models[name] = hf
    return root / "repo", models


def _session(repo: Path, name: str) -> tuple[ort.InferenceSession, dict]:
    manifest = json.loads((repo / name / "1" / "model.json").read_text())
    return ort.InferenceSession(str(repo / name / "1" / manifest["variants"]["fp32"]),
                                providers=["CPUExecutionProvider"]), manifest


@pytest.mark.parametrize("name", EXPORTED)
def test_graph_equals_transformers_ragged_decoding_reused_slot_and_chunks(packages, name: str) -> None:
    repo, models = packages
    hf = models[name]
    sess, manifest = _session(repo, name)
    c = manifest["cache"]
    d = SlotDriver(sess, c["num_layers"], c["num_kv_heads"], c["head_dim"], manifest["max_length"], slots=3)
    seqs = [_seq(40, 1), _seq(7, 2), _seq(23, 3)]
    logits = d.first_prompt(0, seqs, pad=0)
    worst = max(float(np.abs(logits[r, :len(s)] - _hf_logits(hf, s)).max()) for r, s in enumerate(seqs))
    for step in range(4):   # the three rows decode together, each at its own position
        nxt = [int(_hf_logits(hf, s)[-1].argmax()) for s in seqs]
        got = d.decode(nxt, [len(s) for s in seqs])
        seqs = [s + [t] for s, t in zip(seqs, nxt)]
        worst = max(worst, *(float(np.abs(got[r] - _hf_logits(hf, s)[-1]).max()) for r, s in enumerate(seqs)))
    # slot 1 reused for a new 30-token prompt in chunks of 8 (its old, shorter sequence's cache is overwritten)
    fresh = _seq(30, 4)
    for start in range(0, 30, 8):
        part = d.chunk(1, fresh[start:start + 8], start)
        want = _hf_logits(hf, fresh[:start + 8])[start:]
        worst = max(worst, float(np.abs(part - want).max()))
    got = d.decode([5, 6, 7], [len(seqs[0]), 30, len(seqs[2])])
    for r, s in enumerate([seqs[0], fresh, seqs[2]]):
        worst = max(worst, float(np.abs(got[r] - _hf_logits(hf, s + [5 + r])[-1]).max()))
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("name", EXPORTED)
def test_graph_greedy_equals_transformers_generate(packages, name: str) -> None:
    repo, models = packages
    hf = models[name]
    sess, manifest = _session(repo, name)
    prompt = _seq(12, 9)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=30, min_new_tokens=30, do_sample=False,
                           pad_token_id=0)[0, len(prompt):].tolist()
    assert greedy_inplace(sess, manifest, prompt, 30, stop_at_eos=False) == want


def test_graph_rotary_settings(packages) -> None:
    """What the graphs carry: NoPE layers do not rotate, partial rotary's table is the rotary half-width, Qwen3's
    cache head is its own head_dim."""
    import onnx

    repo, _ = packages

    def attention_nodes(name: str):
        manifest = json.loads((repo / name / "1" / "model.json").read_text())
        g = onnx.load(str(repo / name / "1" / manifest["variants"]["fp32"])).graph
        return g, manifest, [n for n in g.node if n.op_type == "GroupQueryAttention"]

    _, _, nodes = attention_nodes("smollm3")
    rotary = [next(a.i for a in n.attribute if a.name == "do_rotary") for n in nodes if not n.name.startswith("chunk")]
    assert rotary == [1, 0]
    # the NoPE layer's op gets no cos / sin: onnxruntime's CUDA kernel faults when handed them with do_rotary 0
    assert [list(n.input[7:]) for n in nodes if not n.name.startswith("chunk")] == [["rope.cos", "rope.sin"], []]
    g, _, _ = attention_nodes("phi3-partial-longrope")
    cos = next(t for t in g.initializer if t.name == "rope.cos")
    assert list(cos.dims) == [64, 8]    # head 32, rotary 16
    _, manifest, _ = attention_nodes("qwen3")
    assert (manifest["cache"]["head_dim"], manifest["architecture"]) == (32, "qwen3")


@pytest.mark.parametrize("name, change, field", [
    # longrope past its original length: transformers switches factors per call, a static table cannot
    ("phi3-partial-longrope", dict(original_max_position_embeddings=16), "rope_type"),
    # rotary 8 channels: the op's table width must be a multiple of 8 (rotary 16)
    ("phi3-partial-longrope", dict(hidden_size=64, rope_parameters=dict(
        ROPE, rope_type="longrope", partial_rotary_factor=0.5, short_factor=[1.0] * 4, long_factor=[1.0] * 4,
        attention_factor=1.0)), "partial_rotary_factor"),
    ("qwen3", dict(head_dim=24), "head_dim"),                          # padded heads would change the q/k RMS
    ("qwen3", dict(use_sliding_window=True, sliding_window=8), "sliding_window"),
    ("smollm3", dict(use_sliding_window=True, sliding_window=8), "sliding_window"),
])
def test_what_a_static_table_cannot_serve_is_refused(tmp_path: Path, name: str, change: dict, field: str) -> None:
    from tests.conftest import tiny_corpus
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    tok = train_tokenizer(tiny_corpus()[:200], TokenizerConfig(kind="bpe", vocab_size=VOCAB, min_frequency=1))
    tok_dir = save_tokenizer(tok, tmp_path / "tok", "bpe", 62)
    hf_model(name, vocab_size=tok.get_vocab_size(), **change).save_pretrained(tmp_path / "ckpt")
    for f in tok_dir.iterdir():
        (tmp_path / "ckpt" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ExportError, match=field) as err:
        export_checkpoint(ExportConfig(checkpoint=tmp_path / "ckpt", task="generate", repository=tmp_path / "repo",
                                       name="x"))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "repo" / "x").exists()


@pytest.mark.parametrize("change, field", [
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "low_freq_factor"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "mrope_section": [1]}}, "mrope"),
])
def test_rope_settings_we_do_not_compute_are_refused_by_name(change: dict, field: str) -> None:
    from training.llama import LlamaConfig

    d = {**SIZES, "model_type": "llama", **change}
    with pytest.raises(ValueError, match=field):
        LlamaConfig.from_hf_dict(d)


def test_dynamic_rope_refuses_positions_past_max_position_embeddings() -> None:
    """transformers rescales dynamic rope past max_position_embeddings and keeps the state between calls: not
    modelled, refused by name; below it the frequencies are the plain ones (test above)."""
    from training.llama import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig.from_hf_dict({**SIZES, "model_type": "llama", "max_position_embeddings": 16,
                                                       **FAMILIES["dynamic"][1]}))
    with pytest.raises(ValueError, match="dynamic"):
        model(torch.tensor([_seq(17, 1)]))
