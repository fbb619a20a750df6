"""RoBERTa, ALBERT, DistilBERT, ELECTRA and Llama-family (Llama, Qwen2, Mistral) against `transformers`.

References are `transformers` models built from small random HF configs (no hub downloads) and saved with
`save_pretrained`, i.e. exactly what a user brings. For every encoder family: our module equals HF (logits
and hidden states on real tokens, batch 3 with padding), our checkpoint loads in AutoModelFor... with no
missing keys, the export's parity gate passes (and fails on a perturbed graph), the manifest declares
whether token_type_ids is an input, and a served Classify / FillMask answer equals transformers on the same
text. For the decoders: HF parity with left padding, cached == uncached, token-by-token == one pass, greedy
== HF generate, and the refused settings (rope scaling, an active sliding window).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from tests.family_models import hf_config as _hf_config
from tests.family_models import save_with_tokenizer, tokenizer_of
from tests.server_process import ServerProcess, wait_ready

from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

LABELS = ["comedy", "history", "tragedy"]
ENCODERS = ("roberta", "albert", "distilbert", "electra")
TOKEN_TYPE_ENCODERS = ("albert", "electra")  # their graphs (and HF's models) take token_type_ids
TEXTS = ["Now is the winter of our discontent", "A horse! a horse! my kingdom for a horse!", "To be"]


HF_CLASSES = {
    ("roberta", "classify"): "RobertaForSequenceClassification", ("roberta", "fill-mask"): "RobertaForMaskedLM",
    ("albert", "classify"): "AlbertForSequenceClassification", ("albert", "fill-mask"): "AlbertForMaskedLM",
    ("distilbert", "classify"): "DistilBertForSequenceClassification",
    ("distilbert", "fill-mask"): "DistilBertForMaskedLM",
    ("electra", "classify"): "ElectraForSequenceClassification", ("electra", "fill-mask"): "ElectraForMaskedLM",
}
MASK_TOKEN = {"roberta": "<mask>", "albert": "[MASK]", "distilbert": "[MASK]", "electra": "[MASK]"}


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """transformers-saved checkpoints (with our trained tokenizers) for every encoder family and task."""
    from tests.conftest import family_tokenizers

    root = tmp_path_factory.mktemp("families")
    toks = family_tokenizers(root)
    out = {}
    torch.manual_seed(0)
    for (family, task), cls_name in HF_CLASSES.items():
        tok_dir, vocab, pad = tokenizer_of(family, toks)
        extra = {"id2label": dict(enumerate(LABELS))} if task == "classify" else {}
        model = getattr(transformers, cls_name)(_hf_config(family, vocab, pad, **extra))
        out[family, task] = save_with_tokenizer(model, tok_dir, root / f"{family}-{task}")
    return out


def _encode(ckpt: Path, texts: list[str], mask_word: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded batch from the checkpoint's tokenizer.json (what the server does)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    if mask_word:
        texts = [t.replace("winter", cfg["mask_token"]) for t in texts]
    encs = [tok.encode(t) for t in texts]
    n = max(len(e.ids) for e in encs)
    pad = tok.token_to_id(cfg["pad_token"])
    ids = torch.full((len(encs), n), pad)
    mask = torch.zeros((len(encs), n), dtype=torch.long)
    types = torch.zeros((len(encs), n), dtype=torch.long)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)], types[i, :len(e.ids)] = (
            torch.tensor(e.ids), 1, torch.tensor(e.type_ids))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _hf_call(hf, family: str, feeds: dict[str, torch.Tensor]):
    if family in TOKEN_TYPE_ENCODERS:
        return hf(**feeds)
    return hf(input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"])  # no token types


@pytest.mark.parametrize("family", ENCODERS)
@pytest.mark.parametrize("task", ["classify", "fill-mask"])
def test_encoder_matches_transformers(hf_checkpoints, family: str, task: str) -> None:
    from training.checkpoint import load_model

    ckpt = hf_checkpoints[family, task]
    ours, _ = load_model(ckpt)  # HF's own file, loaded strictly (no missing / foreign keys)
    hf = transformers.AutoModel.from_pretrained(ckpt)  # the base model, for hidden states
    head = getattr(transformers, HF_CLASSES[family, task]).from_pretrained(ckpt).eval()
    feeds = _encode(ckpt, TEXTS, mask_word=task == "fill-mask")
    real = feeds["attention_mask"].bool()
    assert (~real).any()  # padding is exercised
    if family in TOKEN_TYPE_ENCODERS:  # a second segment on the real tokens past the fourth: type 1 is exercised
        feeds["token_type_ids"] = (torch.arange(real.shape[1]) >= 4).long() * real.long()
    with torch.no_grad():
        ref_hidden = _hf_call(hf.eval(), family, feeds).last_hidden_state
        got_hidden = ours.encode(**feeds)
        got_hidden = got_hidden[0] if isinstance(got_hidden, tuple) else got_hidden
        ref = _hf_call(head, family, feeds).logits
        got = ours(**feeds)
    assert float((ref_hidden - got_hidden).abs()[real].max()) <= 1e-5
    diff = (ref - got).abs()[real] if task == "fill-mask" else (ref - got).abs()
    assert float(diff.max()) <= 1e-5
    # A different input changes the logits: the comparison is not between two constants.
    with torch.no_grad():
        other = ours(**{**feeds, "input_ids": feeds["input_ids"].flip(0)})
    assert float((other - got).abs().max()) > 1e-3


@pytest.mark.parametrize("family", ENCODERS)
def test_our_checkpoint_loads_in_transformers(hf_checkpoints, tmp_path: Path, family: str) -> None:
    from training.checkpoint import load_model, save_model

    for task, auto in (("classify", "AutoModelForSequenceClassification"), ("fill-mask", "AutoModelForMaskedLM")):
        ours, _ = load_model(hf_checkpoints[family, task])
        with torch.no_grad():  # make every weight differ from the file it came from
            for p in ours.parameters():
                p.add_(0.01 * torch.randn_like(p))
        save_model(ours, tmp_path / task)
        hf, info = getattr(transformers, auto).from_pretrained(tmp_path / task, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        assert type(hf).__name__ == HF_CLASSES[family, task]
        feeds = _encode(hf_checkpoints[family, task], TEXTS)
        with torch.no_grad():
            d = (_hf_call(hf.eval(), family, feeds).logits - ours(**feeds)).abs()
        real = feeds["attention_mask"].bool()
        assert float((d[real] if task == "fill-mask" else d).max()) <= 1e-5


# Every BERT-family head model of training/heads.py, by checkpoint kind (its HF class is KINDS' architecture).
HEAD_KINDS = ("bert", *(f"{f}-{h}" for f in ("bert", *ENCODERS) for h in ("mlm", "classifier", "token-classifier")),
              "bert-pretraining", "albert-pretraining")


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_every_head_model_has_hf_parameter_names_and_shapes(kind: str) -> None:
    from training.checkpoint import FAMILY_CONFIG, KINDS

    cls, arch, family = KINDS[kind]
    hf_config = (transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64)
                 if family == "bert" else _hf_config(family, 99, 1 if family == "roberta" else 0))
    # 3 labels, but the pre-training heads keep 2: HF's AlbertSOPHead is num_labels wide, ours (like NSP) 2.
    hf_config.num_labels = 2 if kind.endswith("pretraining") else 3
    ours = cls(FAMILY_CONFIG[family].from_hf_dict(hf_config.to_dict()))
    hf = getattr(transformers, arch)(hf_config)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in hf.state_dict().items()}


def test_albert_shares_one_layer_and_is_smaller_than_bert() -> None:
    from training.albert import AlbertConfig, AlbertForMaskedLM
    from training.bert import BertConfig, BertForMaskedLM

    albert = AlbertForMaskedLM(AlbertConfig.preset("small", vocab_size=8000))
    bert = BertForMaskedLM(BertConfig.preset("small", vocab_size=8000))
    layer_params = [n for n, _ in albert.named_parameters() if ".albert_layers." in n]
    assert all(".albert_layer_groups.0.albert_layers.0." in n for n in layer_params)
    n_albert = sum(p.numel() for p in albert.parameters())
    n_bert = sum(p.numel() for p in bert.parameters())
    # Embeddings V*E + E*H instead of V*H, and one layer instead of four.
    assert n_albert < 0.5 * n_bert


# ----------------------------------------------------------------------------- export + gate + serving


@pytest.fixture(scope="module")
def family_repository(hf_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("family_repository")
    reports = {}
    with one_torch_thread():
        for (family, task), ckpt in hf_checkpoints.items():
            # Classifiers also get the fused variant (the server then serves it: the cpu default).
            variants = ("fp32", "optimized") if task == "classify" else ("fp32",)
            r = export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name=f"{family}-{task}",
                                               variants=variants))
            reports[f"{family}-{task}"] = r.parity
    return repo, reports


@pytest.mark.parametrize("family", ENCODERS)
def test_export_gate_passes_and_manifest_declares_token_types(family_repository, family: str) -> None:
    repo, reports = family_repository
    for task in ("classify", "fill-mask"):
        name = f"{family}-{task}"
        m = json.loads((repo / name / "1" / "model.json").read_text())
        p = reports[name]
        assert p["passed"] and p["variants"]["fp32"]["passed"]
        assert max(p["variants"]["fp32"]["max_abs_diff"].values()) < 1e-4
        assert m["architecture"] == family
        names = [i["name"] for i in m["inputs"]]
        assert names == (["input_ids", "attention_mask", "token_type_ids"] if family in TOKEN_TYPE_ENCODERS
                         else ["input_ids", "attention_mask"])
        import onnx
        graph_inputs = [i.name for i in onnx.load(str(repo / name / "1" / "model.onnx")).graph.input]
        assert graph_inputs == names
        if task == "fill-mask":
            assert m["mask_token"] == MASK_TOKEN[family]
    opt = reports[f"{family}-classify"]["variants"]["optimized"]
    assert opt["passed"]
    layers = 3 if family == "albert" else 2
    assert opt["fused_operators"]["Attention"] == (layers - 1 if family == "albert" else layers)
    assert "SkipLayerNormalization" not in opt["fused_operators"]    # left apart: "Residual norms", decoder_graph.py
    if family == "electra":  # E != H: the embedding LayerNorm still fuses (at width E), and every layer's GELU
        assert opt["fused_operators"]["EmbedLayerNormalization"] == 1
        assert opt["fused_operators"]["BiasGelu"] == layers


@pytest.mark.parametrize("name", ["roberta-fill-mask", "distilbert-classify", "albert-classify",
                                  "electra-fill-mask"])
def test_validate_reruns_the_gate_on_family_packages(family_repository, name: str) -> None:
    from export.validate import validate_package

    repo, _ = family_repository
    passed, table = validate_package(repo / name / "1")
    assert passed, table


@pytest.mark.parametrize("family", ENCODERS)
def test_embed_export_of_a_family_classifier_equals_transformers(hf_checkpoints, tmp_path: Path,
                                                                 family: str) -> None:
    """--task embed on a 3-label classifier checkpoint: its own encoder, mean-pooled, equal to transformers'."""
    import onnxruntime
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    ckpt = hf_checkpoints[family, "classify"]
    with one_torch_thread():
        r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="embed", repository=tmp_path, name="emb"))
    assert r.parity["passed"]
    m = json.loads((r.package_dir / "model.json").read_text())
    names = [i["name"] for i in m["inputs"]]
    assert names == (["input_ids", "attention_mask", "token_type_ids"] if family in TOKEN_TYPE_ENCODERS
                     else ["input_ids", "attention_mask"])
    feeds = _encode(ckpt, TEXTS)
    session = onnxruntime.InferenceSession(str(r.package_dir / m["variants"]["fp32"]),
                                           providers=["CPUExecutionProvider"])
    got = session.run(["embeddings"], {n: feeds[n].numpy() for n in names})[0]
    hf = transformers.AutoModel.from_pretrained(ckpt).eval()
    with torch.no_grad():
        hidden = _hf_call(hf, family, feeds).last_hidden_state
    mask = feeds["attention_mask"][..., None].float()
    want = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert float(np.abs(got - want).max()) <= 1e-4


def test_gate_fails_on_a_perturbed_roberta_graph(hf_checkpoints, tmp_path: Path, monkeypatch) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ParityFailure

    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "fp32")
    with pytest.raises(ParityFailure) as exc:
        export_checkpoint(ExportConfig(checkpoint=hf_checkpoints["roberta", "classify"], task="classify",
                                       repository=tmp_path / "repo", name="bad"))
    assert "FAIL" in str(exc.value)
    assert not (tmp_path / "repo" / "bad" / "1").exists()


def test_unsupported_family_is_refused_with_its_name(tmp_path: Path) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    # Funnel Transformer (an encoder that pools the sequence between blocks) is a family we do not build; its
    # config as transformers writes it.
    d = tmp_path / "funnel"
    cfg = transformers.FunnelConfig(vocab_size=50, d_model=32, n_head=2, block_sizes=[1], d_inner=64).to_dict()
    cfg["architectures"] = ["FunnelForSequenceClassification"]
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="unsupported architecture 'FunnelForSequenceClassification'") as exc:
        export_checkpoint(ExportConfig(checkpoint=d, task="classify", repository=tmp_path / "r", name="x"))
    assert "ElectraForSequenceClassification" in str(exc.value)  # the supported list names the families we have
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_electra_without_projection_matches_transformers(tmp_path: Path) -> None:
    """E == H (ELECTRA-base/large): HF has no embeddings_project, and neither do we (no extra key either way)."""
    from training.checkpoint import load_model, save_model

    torch.manual_seed(2)
    hf = transformers.ElectraForSequenceClassification(transformers.ElectraConfig(
        vocab_size=90, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, initializer_range=0.2, num_labels=3)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours, config = load_model(tmp_path / "hf")
    assert not config.projected and ours.electra.embeddings_project is None
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (3, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    types = (torch.arange(8) >= 3).long() * mask
    with torch.no_grad():
        d = (hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits - ours(ids, mask, types)).abs()
    assert float(d.max()) <= 1e-5
    save_model(ours, tmp_path / "ours")
    _, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours",
                                                                            output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_served_answers_equal_transformers(family_repository, hf_checkpoints) -> None:
    repo, _ = family_repository
    proc = ServerProcess(repo)
    try:
        wait_ready(proc.address)
        with grpc.insecure_channel(proc.address) as ch:
            stub = pb_grpc.TaskServiceStub(ch)
            for family in ENCODERS:
                ckpt = hf_checkpoints[family, "classify"]
                hf = transformers.AutoModelForSequenceClassification.from_pretrained(ckpt).eval()
                got = stub.Classify(pb.ClassifyRequest(model=f"{family}-classify",
                                                       inputs=[pb.TextInput(text=t) for t in TEXTS]))
                for text, res in zip(TEXTS, got.results):
                    feeds = _encode(ckpt, [text])
                    with torch.no_grad():
                        probs = _softmax(_hf_call(hf, family, feeds).logits[0].numpy())
                    served = {s.label: s.score for s in res.scores}
                    # The served variant is the fused one (optimized, gated at 5e-4 on logits).
                    np.testing.assert_allclose([served[lab] for lab in LABELS], probs, atol=1e-3)
                    assert res.label == LABELS[int(probs.argmax())] or abs(np.sort(probs)[-1] - np.sort(probs)[-2]) < 1e-3

                ckpt = hf_checkpoints[family, "fill-mask"]
                hf = transformers.AutoModelForMaskedLM.from_pretrained(ckpt).eval()
                text = TEXTS[0].replace("winter", MASK_TOKEN[family])
                feeds = _encode(ckpt, [text])
                mask_id = json.loads((repo / f"{family}-fill-mask" / "1" / "model.json").read_text())[
                    "special_tokens"]["mask"]
                pos = int((feeds["input_ids"][0] == mask_id).nonzero()[0, 0])
                with torch.no_grad():
                    probs = _softmax(_hf_call(hf, family, feeds).logits[0, pos].numpy())
                res = stub.FillMask(pb.FillMaskRequest(model=f"{family}-fill-mask", texts=[text], top_k=3))
                masks = res.results[0].masks
                assert [m.position for m in masks] == [pos]
                assert [c.token_id for c in masks[0].candidates] == list(np.argsort(-probs)[:3])
                np.testing.assert_allclose([c.score for c in masks[0].candidates], np.sort(probs)[::-1][:3],
                                           rtol=1e-4, atol=1e-6)

            # Raw KServe tensors follow the manifest too: RoBERTa takes two inputs, a third is named and refused.
            kserve = kserve_grpc.GRPCInferenceServiceStub(ch)
            feeds = {k: v.numpy() for k, v in _encode(hf_checkpoints["roberta", "fill-mask"], TEXTS[:1]).items()}

            def raw(names: tuple[str, ...]) -> Any:
                req = kserve_pb.ModelInferRequest(model_name="roberta-fill-mask")
                for n in names:
                    req.inputs.add(name=n, datatype="INT64", shape=list(feeds[n].shape))
                    req.raw_input_contents.append(feeds[n].tobytes())
                return kserve.ModelInfer(req)

            ok = raw(("input_ids", "attention_mask"))
            logits = np.frombuffer(ok.raw_output_contents[0], dtype=np.float32).reshape(ok.outputs[0].shape)
            hf = transformers.AutoModelForMaskedLM.from_pretrained(hf_checkpoints["roberta", "fill-mask"]).eval()
            with torch.no_grad():
                ref = hf(input_ids=torch.from_numpy(feeds["input_ids"]),
                         attention_mask=torch.from_numpy(feeds["attention_mask"])).logits.numpy()
            assert float(np.abs(logits - ref).max()) <= 1e-4
            with pytest.raises(grpc.RpcError) as err:
                raw(("input_ids", "attention_mask", "token_type_ids"))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "token_type_ids" in err.value.details()
    finally:
        proc.stop()


# ----------------------------------------------------------------------------- Llama family


def _hf_decoder(kind: str, **extra: Any):
    sizes = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)
    sizes.update(extra)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**sizes)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "mistral":
        cfg = transformers.MistralConfig(sliding_window=None, **sizes)
        cls = transformers.MistralForCausalLM
    else:
        cfg = transformers.LlamaConfig(**sizes)
        cls = transformers.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    return cls(cfg).eval()


DECODERS = {
    "llama-untied": ("llama", dict(tie_word_embeddings=False)),
    "llama-tied-bias-theta": ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                            rope_theta=500.0)),
    "llama-mha": ("llama", dict(num_key_value_heads=4)),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),   # q/k/v biases
    "mistral": ("mistral", dict()),
}


def _ours_from_hf(hf, tmp_path: Path):
    from training.checkpoint import load_model

    hf.save_pretrained(tmp_path / "hf")
    model, config = load_model(tmp_path / "hf")
    return model, config


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 97, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_matches_transformers_with_left_padding(tmp_path: Path, name: str) -> None:
    kind, extra = DECODERS[name]
    hf = _hf_decoder(kind, **extra)
    ours, config = _ours_from_hf(hf, tmp_path)
    assert config.model_type == kind and config.num_key_value_heads == extra.get("num_key_value_heads", 2)
    ids, mask = _left_padded()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    captured = {}
    ours.model.norm.register_forward_hook(lambda m, i, o: captured.setdefault("h", o))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        logits, presents = ours(ids, mask)
    real = mask.bool()
    assert float((ref.logits - logits).abs()[real].max()) <= 1e-5
    assert float((ref.hidden_states[-1] - captured["h"]).abs()[real].max()) <= 1e-5
    assert presents[0][0].shape == (3, config.num_key_value_heads, 9, config.head_dim)
    # Our checkpoint loads back into transformers with every weight.
    from training.checkpoint import save_model
    save_model(ours, tmp_path / "ours")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(back).__name__ == type(hf).__name__
    back.config._attn_implementation = "eager"
    with torch.no_grad():
        again = back.eval()(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert float((again - logits).abs()[real].max()) <= 1e-5


@pytest.mark.parametrize("name", ["llama-untied", "qwen2"])
def test_decoder_cache_token_by_token_equals_one_pass(tmp_path: Path, name: str) -> None:
    kind, extra = DECODERS[name]
    ours, _ = _ours_from_hf(_hf_decoder(kind, **extra), tmp_path)
    ids, mask = _left_padded()
    real = mask.bool()
    with torch.no_grad():
        full, full_kv = ours(ids, mask)
        # prompt of 4, then one token at a time through the cache
        logits, past = ours(ids[:, :4], mask[:, :4])
        steps = [logits]
        for t in range(4, ids.shape[1]):
            logits, past = ours(ids[:, t:t + 1], mask[:, :t + 1], past_key_values=past)
            steps.append(logits)
        cached = torch.cat(steps, dim=1)
        # and an explicit empty past is the same code path as no past
        empty, _ = ours(ids, mask, past_key_values=ours.empty_past(3))
    assert float((cached - full).abs()[real].max()) <= 1e-5
    for (k1, v1), (k2, v2) in zip(past, full_kv):
        assert float((k1 - k2).transpose(1, 2)[real].abs().max()) <= 1e-5
        assert float((v1 - v2).transpose(1, 2)[real].abs().max()) <= 1e-5
    assert torch.equal(empty, full)


def test_rotary_cache_is_the_half_width_table_of_forward() -> None:
    from training.llama import LlamaConfig, LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(LlamaConfig.preset("tiny", vocab_size=50, rope_theta=500.0))
    cos, sin = rope.cache(40)
    pos = torch.tensor([[0, 3, 39]])
    full_cos, full_sin = rope(pos, torch.float32)
    half = cos.shape[1]
    assert cos.shape == (40, 8) and torch.equal(full_cos[0, :, :half], cos[pos[0]])
    assert torch.equal(full_cos[0, :, half:], cos[pos[0]]) and torch.equal(full_sin[0, :, :half], sin[pos[0]])
    assert float(cos[39, 0]) == pytest.approx(np.cos(39.0), abs=1e-6)  # frequency pair 0 turns 1 rad per position


def test_decoder_greedy_equals_transformers_generate(tmp_path: Path) -> None:
    from training.llama import generate_greedy

    hf = _hf_decoder("llama", tie_word_embeddings=False)
    ours, _ = _ours_from_hf(hf, tmp_path)
    ids, mask = _left_padded()
    want = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                       pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    got = generate_greedy(ours, ids, mask, 12)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind,change,field", [
    ("llama", {"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type"),
    ("llama", {"rope_scaling": {"type": "linear"}}, "rope_scaling.factor"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("mistral", {"sliding_window": 16}, "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "sliding_window"),
])
def test_decoder_refuses_what_it_would_get_wrong(tmp_path: Path, kind: str, change: dict, field: str) -> None:
    from training.checkpoint import CheckpointError, load_model

    hf = _hf_decoder(kind)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=field):
        load_model(tmp_path)


def test_mistral_sliding_window_at_context_length_is_not_active(tmp_path: Path) -> None:
    from training.checkpoint import load_model

    hf = _hf_decoder("mistral")
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["sliding_window"] = cfg["max_position_embeddings"]  # never restricts anything: loads
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model, config = load_model(tmp_path)
    assert config.model_type == "mistral"


# ----------------------------------------------------------------------------- decoder export through the gate


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    from tests.conftest import tiny_corpus
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    tok = train_tokenizer(tiny_corpus(), TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1))
    return save_tokenizer(tok, tmp_path_factory.mktemp("bpe") / "tok", "bpe", 62), tok.get_vocab_size()


def _decoder_checkpoint(bpe_tokenizer: tuple[Path, int], kind: str, dest: Path, **extra: Any) -> Path:
    tok_dir, vocab = bpe_tokenizer
    # head_dim 16: a multiple of 16, as onnxruntime's GroupQueryAttention takes (others are padded: slower).
    sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96)
    _hf_decoder(kind, **{**sizes, **extra}).save_pretrained(dest)
    for f in tok_dir.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_mistral_package_passes_the_gate_with_grouped_query_cache(bpe_tokenizer, tmp_path: Path) -> None:
    """Mistral (sliding window off) exports like Llama: in-place graph, kv_heads < heads, every gate check run."""
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    ckpt = _decoder_checkpoint(bpe_tokenizer, "mistral", tmp_path / "mistral")
    with one_torch_thread():
        r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=tmp_path / "repo",
                                           name="mistral"))
    m = json.loads((r.package_dir / "model.json").read_text())
    assert m["architecture"] == "mistral" and m["cache"]["layout"] == "inplace"
    assert (m["cache"]["num_heads"], m["cache"]["num_kv_heads"]) == (4, 2)
    checks = r.parity["variants"]["fp32"]["checks"]
    assert r.parity["passed"] and len(checks) >= 4 and all(c["passed"] for c in checks)


def test_gate_fails_on_a_perturbed_llama_graph(bpe_tokenizer, tmp_path: Path, monkeypatch) -> None:
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint
    from export.errors import ParityFailure

    ckpt = _decoder_checkpoint(bpe_tokenizer, "llama", tmp_path / "llama", tie_word_embeddings=False)
    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "fp32")
    with pytest.raises(ParityFailure) as exc, one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=tmp_path / "repo", name="bad"))
    assert "FAIL" in str(exc.value)
    assert not (tmp_path / "repo" / "bad" / "1").exists()


def test_a_head_dim_the_attention_op_does_not_take_is_padded_and_passes_the_gate(bpe_tokenizer, tmp_path: Path) -> None:
    """A transformers Llama with head_dim 8 (onnxruntime's GroupQueryAttention takes multiples of 16): its heads are
    zero-padded to 16 with rotary pairs kept together; every gate check passes (tests/export/test_padded_heads.py serves
    padded GPT-2 and Llama models)."""
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    ckpt = _decoder_checkpoint(bpe_tokenizer, "llama", tmp_path / "llama", hidden_size=32)  # head_dim 8
    with one_torch_thread():
        r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=tmp_path / "repo", name="x"))
    cache = json.loads((r.package_dir / "model.json").read_text())["cache"]
    assert (cache["head_dim"], cache["model_head_dim"], cache["num_kv_heads"]) == (16, 8, 2)
    checks = r.parity["variants"]["fp32"]["checks"]
    assert r.parity["passed"] and len(checks) >= 4 and all(c["passed"] for c in checks)
