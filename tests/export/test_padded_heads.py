"""Head sizes onnxruntime's GroupQueryAttention does not take (not a multiple of 16), exported with the in-place
cache by zero-padding every head (export/decoder_weights.pad_heads): a GPT-2 with head_dim 24 (fp32 and kv8) and a
Llama with head_dim 12 (rotary, grouped-query, biased) pass the parity gate against PyTorch, and a real server
streams the ids that offline greedy on the same graph and PyTorch greedy on the checkpoint give."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from export import decoder_graph, decoder_weights
from export.parity_inplace import SlotDriver
from modelpkg import Manifest, head_channels
from testing.offline import greedy_generate
from tests.server_process import ServerProcess, staggered_streams

GPT, LLAMA = "gpt-h24", "llama-h12"
PROMPTS = ["ROMEO.", "Once more unto the breach, dear friends, once more; or close the wall up", "a",
           "to be or not to be, that is the question", "My lord"]
NEW_TOKENS = [12, 6, 20, 9, 4]


def _gpt(vocab: int, eot: int) -> torch.nn.Module:
    from training.gpt import GPT2LMHeadModel, GPTConfig

    torch.manual_seed(3)
    return GPT2LMHeadModel(GPTConfig.preset("tiny", vocab_size=vocab, n_embd=48, n_head=2, initializer_range=0.1,
                                            bos_token_id=eot, eos_token_id=eot)).eval()   # head_dim 24


def _llama(vocab: int, eot: int) -> torch.nn.Module:
    from training.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        attention_bias=True, initializer_range=0.2, bos_token_id=eot,
                                        eos_token_id=eot)).eval()                         # head_dim 12


@pytest.fixture(scope="module")
def packages(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint
    from training.checkpoint import save_model

    root = tmp_path_factory.mktemp("padded-heads")
    tok_files = {p.name: p for p in tiny_checkpoints.gpt.iterdir() if p.name.startswith(("tokenizer", "special"))}
    tok = Tokenizer.from_file(str(tiny_checkpoints.gpt / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    models = {GPT: (_gpt(tok.get_vocab_size(), eot), ("fp32", "kv8")),
              LLAMA: (_llama(tok.get_vocab_size(), eot), ("fp32",))}
    with one_torch_thread():
        for name, (model, variants) in models.items():
            save_model(model, root / name, tokenizer_files=tok_files)
            export_checkpoint(ExportConfig(checkpoint=root / name, task="generate", repository=root / "repo",
                                           name=name, variants=variants))
    return root / "repo", {name: m for name, (m, _) in models.items()}, tok


def _torch_greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        logits, past = model(torch.tensor([out]))
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits, past = model(torch.tensor([[out[-1]]]), torch.ones(1, len(out), dtype=torch.long),
                                 past_key_values=past)
    return out[len(ids):]


@pytest.mark.parametrize("name, model_head_dim, kv_heads", [(GPT, 24, 2), (LLAMA, 12, 2)])
def test_padded_package_describes_its_cache_and_passes_the_gate(packages, name: str, model_head_dim: int,
                                                               kv_heads: int) -> None:
    repo, _, _ = packages
    pkg = repo / name / "1"
    manifest = Manifest.from_json((pkg / "model.json").read_text())
    assert manifest.cache.layout == "inplace"
    assert (manifest.cache.head_dim, manifest.cache.model_head_dim) == (32 if model_head_dim == 24 else 16,
                                                                        model_head_dim)
    # cache.head_dim is the tensor the server allocates: the graph's past/present of every graph file
    graphs = set(manifest.variants.values()) | set(json.loads((pkg / "model.json").read_text())["cache"]
                                                   ["mixed_graphs"].values())
    for file in graphs:
        for value in onnx.load(str(pkg / file)).graph.input:
            if value.name.startswith(("past_key_values.", "chunk.past_key_values.")):
                dims = [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
                assert dims[1:] == [kv_heads, "max_sequence", manifest.cache.head_dim], (file, value.name)
    parity = json.loads((pkg / "parity.json").read_text())
    assert parity["passed"] is True
    for variant, result in parity["variants"].items():
        assert result["passed"] is True and all(c["passed"] for c in result["checks"]), variant
    fp32 = parity["variants"]["fp32"]
    assert any(f"from {model_head_dim} to {manifest.cache.head_dim}" in n for n in fp32["notes"])
    names = {c["name"] for c in fp32["checks"]}
    assert {"rows of different lengths in one batch", "greedy 64 tokens identical ids",
            "mixed graph: decode rows and a prompt chunk in one run"} <= names


def test_validate_reruns_the_gate_on_a_padded_package(packages) -> None:
    from export.validate import validate_package

    repo, _, _ = packages
    passed, table = validate_package(repo / LLAMA / "1")
    assert passed, table


def test_the_padded_channels_stay_zero_and_the_model_channels_equal_pytorch(packages) -> None:
    """The cache layout modelpkg.head_channels documents, read straight from the buffers the graph wrote."""
    repo, models, tok = packages
    for name in (GPT, LLAMA):
        pkg = repo / name / "1"
        cache = Manifest.from_json((pkg / "model.json").read_text()).cache
        sess = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
        d = SlotDriver(sess, cache.num_layers, cache.kv_heads, cache.head_dim, 128, 1)   # all of the padded head
        ids = tok.encode(PROMPTS[1]).ids
        d.first_prompt(0, [ids], 0)
        with torch.no_grad():
            _, presents = models[name](torch.tensor([ids]))
        want = [t[0].numpy() for kv in presents for t in kv]
        pad = sorted(set(range(cache.head_dim)) - set(cache.channels))
        for got, ref in zip(d.cache(0, len(ids)), want):
            np.testing.assert_allclose(got[..., cache.channels], ref, atol=1e-5)
            assert not got[..., pad].any()


def test_the_scale_attribute_is_what_keeps_padded_heads_exact(packages) -> None:
    """Without `scale` the op divides q.k by sqrt(32) instead of sqrt(24): the logits move (so the gate's
    comparison would catch a graph that forgot it)."""
    repo, models, tok = packages
    weights = decoder_weights.pad_heads(decoder_weights.gpt2_weights(models[GPT], 128))
    graph = decoder_graph.build_decoder_graph(weights)
    attention = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    assert [a.f for n in attention for a in n.attribute if a.name == "scale"] == [pytest.approx(24 ** -0.5)] * 2
    ids = tok.encode(PROMPTS[1]).ids
    with torch.no_grad():
        want = models[GPT](torch.tensor([ids]))[0][0].numpy()

    def logits(model: onnx.ModelProto) -> np.ndarray:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return SlotDriver(sess, 2, 2, 24, 128, 1).first_prompt(0, [ids], 0)[0]

    assert np.abs(logits(graph) - want).max() < 1e-4
    for n in attention:
        n.attribute.remove(next(a for a in n.attribute if a.name == "scale"))
    assert np.abs(logits(graph) - want).max() > 1e-2


def test_rotary_pairs_need_the_split_placement() -> None:
    """Rotate-half rotary pairs channel j with j + head_dim/2: the model's halves start each half of the padded
    head, so its pairs stay pairs (a plain trailing pad would pair channel 0 with channel 8 of a 12-wide head)."""
    assert head_channels(12, 16) == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]
    assert head_channels(24, 32)[12] == 16 and head_channels(25, 32)[13] == 16
    assert head_channels(16, 16) == list(range(16))


def test_server_streams_padded_models_as_offline_and_pytorch_greedy(packages) -> None:
    repo, models, tok = packages
    with ServerProcess(repo, ["--max-sequences", "3", "--prefill-chunk-tokens", "4"]) as server:
        served = {name: staggered_streams(server.address, name, PROMPTS, NEW_TOKENS) for name in (GPT, LLAMA)}
    for name in (GPT, LLAMA):
        pkg = repo / name / "1"
        manifest = json.loads((pkg / "model.json").read_text())
        session = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
        for i, prompt in enumerate(PROMPTS):
            ids = tok.encode(prompt).ids
            offline = greedy_generate(session, manifest, ids, NEW_TOKENS[i], stop_at_eos=False)
            assert served[name][i] == offline, f"{name} prompt {i}: served ids differ from offline greedy"
            assert offline == _torch_greedy(models[name], ids, NEW_TOKENS[i]), f"{name} prompt {i}: vs PyTorch"


def _lone_kv8_greedy(pkg: Path, ids: list[int], n: int) -> list[int]:
    cache = Manifest.from_json((pkg / "model.json").read_text()).cache
    sess = ort.InferenceSession(str(pkg / "model.kv8.onnx"), providers=["CPUExecutionProvider"])
    d = SlotDriver(sess, cache.num_layers, cache.kv_heads, cache.real_head_dim, 128, 1)
    assert all(b.dtype == np.int8 and b.shape[-1] == cache.head_dim for b in d.bufs.values())
    out = [int(d.first_prompt(0, [ids], 0)[0, len(ids) - 1].argmax())]
    for step in range(n - 1):
        out.append(int(d.decode([out[-1]], [len(ids) + step])[0].argmax()))
    return out


def test_server_streams_the_padded_int8_cache_as_the_graph_alone(packages) -> None:
    repo, _, tok = packages
    with ServerProcess(repo, ["--variant", "kv8", "--max-sequences", "2", "--prefill-chunk-tokens", "4"]) as server:
        served = staggered_streams(server.address, GPT, PROMPTS, NEW_TOKENS)
        loaded = [line for line in server.lines if f"generation {GPT}:" in line]
    assert loaded and "of int8" in loaded[0], loaded
    for i, prompt in enumerate(PROMPTS):
        assert served[i] == _lone_kv8_greedy(repo / GPT / "1", tok.encode(prompt).ids, NEW_TOKENS[i]), i
