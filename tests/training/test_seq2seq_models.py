"""Encoder-decoder families (training/marian.py, bart.py, t5.py) against `transformers`.

References are `transformers` models built from small random HF configs (no hub downloads) and saved with
`save_pretrained`, i.e. exactly what a user brings. For each: our model loaded from that directory gives the
same logits on a padded batch whose sources and targets have different lengths; token-by-token decoding
through the cache equals one pass; greedy decoding equals HF `generate` (with HF's own forced-token
defaults); our saved checkpoint loads back into transformers with every weight and equal logits.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

_SMALL = dict(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
              dropout=0.0, init_std=0.2)
_T5 = dict(vocab_size=60, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
           relative_attention_max_distance=12, dropout_rate=0.0, decoder_start_token_id=0, initializer_factor=2.0)

# name -> (HF config class, HF model class, config kwargs)
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # The original Transformer as our g2p model uses it: one vocabulary, sqrt(d) embeddings, relu, tied head.
    "marian": ("MarianConfig", "MarianMTModel",
               dict(pad_token_id=59, decoder_start_token_id=59, eos_token_id=0, scale_embedding=True,
                    activation_function="relu", **_SMALL)),
    # Separate source / target vocabularies (the decoder and head have 45 rows), head tied to the decoder's.
    "marian-two-vocabs": ("MarianConfig", "MarianMTModel",
                          dict(pad_token_id=3, decoder_start_token_id=3, eos_token_id=0, decoder_vocab_size=45,
                               share_encoder_decoder_embeddings=False, **_SMALL)),
    "marian-untied-odd-width": ("MarianConfig", "MarianMTModel",
                                dict(pad_token_id=59, decoder_start_token_id=59, eos_token_id=0,
                                     tie_word_embeddings=False,
                                     **{**_SMALL, "d_model": 30, "encoder_attention_heads": 3,
                                        "decoder_attention_heads": 2})),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(**_SMALL)),
    "bart-scaled": ("BartConfig", "BartForConditionalGeneration", dict(scale_embedding=True, **_SMALL)),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(**_T5)),
    # T5 v1.1 / Flan: gated-GELU feed-forward, no decoder-output scaling; d_kv * heads != d_model.
    "t5-gated": ("T5Config", "T5ForConditionalGeneration",
                 dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **{**_T5, "d_kv": 6})),
}


def _hf_model(name: str):
    cfg_cls, model_cls, kw = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    return getattr(transformers, model_cls)(cfg).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq2seq")
    out = {}
    for name in MODELS:
        _hf_model(name).save_pretrained(root / name)
        out[name] = root / name
    return out


def _batch(pad: int) -> tuple[torch.Tensor, ...]:
    """Sources of lengths 11, 7, 3 and targets of lengths 4, 6, 2: right-padded, as transformers takes them."""
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 44, (3, 11), generator=g)
    sm = torch.ones_like(src)
    sm[1, 7:] = 0
    sm[2, 3:] = 0
    tgt = torch.randint(4, 44, (3, 6), generator=g)
    tm = torch.ones_like(tgt)
    tm[0, 4:] = 0
    tm[2, 2:] = 0
    return src.masked_fill(sm == 0, pad), sm, tgt.masked_fill(tm == 0, pad), tm


def _close(ref: torch.Tensor, got: torch.Tensor, where: torch.Tensor) -> float:
    """Largest difference on real positions relative to the logits' scale (T5 logits reach the hundreds)."""
    return float((ref - got).abs()[where].max()) / max(1.0, float(ref.abs()[where].max()))


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_equal_transformers_on_a_padded_batch(saved: dict[str, Path], name: str) -> None:
    from training.checkpoint import load_model

    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(saved[name]).eval()
    hf.config._attn_implementation = "eager"
    ours, config = load_model(saved[name])
    assert type(ours).__name__ == type(hf).__name__
    src, sm, tgt, tm = _batch(config.pad_token_id)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=sm, decoder_input_ids=tgt, decoder_attention_mask=tm).logits
        got = ours(src, sm, tgt, tm)
    assert got.shape == ref.shape
    assert _close(ref, got, tm.bool()) <= 1e-5


@pytest.mark.parametrize("name", ["marian", "bart", "t5-gated"])
def test_cached_steps_equal_one_pass(saved: dict[str, Path], name: str) -> None:
    from training.checkpoint import load_model

    ours, config = load_model(saved[name])
    src, sm, tgt, tm = _batch(config.pad_token_id)
    with torch.no_grad():
        full = ours(src, sm, tgt, tm)
        cross = ours.cross_key_values(ours.encode(src, sm))
        logits, past = ours.decode(tgt[:, :2], cross, sm, tm[:, :2])
        steps = [logits]
        for t in range(2, tgt.shape[1]):
            logits, past = ours.decode(tgt[:, t:t + 1], cross, sm, tm[:, :t + 1], past_key_values=past)
            steps.append(logits)
    assert past[0][0].shape[2] == tgt.shape[1]
    assert _close(full, torch.cat(steps, dim=1), tm.bool()) <= 1e-5


@pytest.mark.parametrize("name", ["marian", "marian-two-vocabs", "bart", "t5", "t5-gated"])
def test_greedy_equals_transformers_generate(saved: dict[str, Path], name: str) -> None:
    from training.checkpoint import load_model
    from training.seq2seq import generate_greedy

    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(saved[name]).eval()
    ours, config = load_model(saved[name])
    src, sm, _, _ = _batch(config.pad_token_id)
    # HF's defaults stay on: Marian/BART force eos at the length limit, and so must we.
    want = hf.generate(input_ids=src, attention_mask=sm, max_new_tokens=8, do_sample=False, num_beams=1)
    got = generate_greedy(ours, src, sm, 8)
    assert torch.equal(got, want[:, 1:]), (got.tolist(), want.tolist())
    assert int(want[0, 0]) == config.decoder_start_token_id


@pytest.mark.parametrize("name", list(MODELS))
def test_our_checkpoint_loads_in_transformers(saved: dict[str, Path], tmp_path: Path, name: str) -> None:
    from training.checkpoint import load_model, save_model

    ours, config = load_model(saved[name])
    save_model(ours, tmp_path / "ours")
    back, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(back).__name__ == MODELS[name][1]
    back.config._attn_implementation = "eager"
    src, sm, tgt, tm = _batch(config.pad_token_id)
    with torch.no_grad():
        again = back.eval()(input_ids=src, attention_mask=sm, decoder_input_ids=tgt, decoder_attention_mask=tm).logits
        got = ours(src, sm, tgt, tm)
    assert _close(again, got, tm.bool()) <= 1e-5
    # and loads back into ours unchanged
    twice, _ = load_model(tmp_path / "ours")
    with torch.no_grad():
        assert torch.equal(twice(src, sm, tgt, tm), got)


def test_our_fresh_transformer_is_a_marian_mt_model(tmp_path: Path) -> None:
    """A model built by us (not loaded) saves as MarianMTModel: same logits and same greedy output in HF."""
    from training.checkpoint import save_model
    from training.marian import MarianConfig, MarianMTModel
    from training.seq2seq import generate_greedy

    torch.manual_seed(0)
    config = MarianConfig(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=32, activation_function="relu", scale_embedding=True,
                          pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None)
    ours = MarianMTModel(config).eval()
    with torch.no_grad():
        ours.final_logits_bias.normal_()  # a non-zero buffer must travel too
    save_model(ours, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["MarianMTModel"] and cfg["model_type"] == "marian"
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    src, sm, tgt, tm = _batch(0)
    src, tgt = src.clamp(max=49), tgt.clamp(max=49)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=sm, decoder_input_ids=tgt, decoder_attention_mask=tm).logits
        got = ours(src, sm, tgt, tm)
    assert _close(ref, got, tm.bool()) <= 1e-5
    want = hf.generate(input_ids=src, attention_mask=sm, max_new_tokens=6, do_sample=False, num_beams=1)
    assert torch.equal(generate_greedy(ours, src, sm, 6), want[:, 1:])


@pytest.mark.parametrize("dim", [16, 15])
def test_sinusoids_are_hf_marians(dim: int) -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from training.marian import sinusoidal_table

    ref = MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
    table = sinusoidal_table(50, dim)
    assert torch.allclose(table, ref, atol=1e-6, rtol=0)
    half = (dim + 1) // 2
    # Frequency 0 turns 1 rad per position: its sin is column 0, its cos the first column of the second half.
    assert torch.allclose(table[7, 0], torch.tensor(7.0).sin())
    assert torch.allclose(table[7, half], torch.tensor(7.0).cos())


def test_a_distinct_head_in_a_tied_t5_file_is_loaded_untied(saved: dict[str, Path], tmp_path: Path) -> None:
    """A T5 v1.1 file written by transformers 4 says tie_word_embeddings=false and carries lm_head; transformers 5
    configs always say tied: either way the file's own head is used (as transformers does)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from training.checkpoint import load_model

    shutil.copytree(saved["t5-gated"], tmp_path, dirs_exist_ok=True)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["lm_head.weight"] = torch.randn_like(sd["shared.weight"])
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours, config = load_model(tmp_path)
    assert not config.tie_word_embeddings and not config.scale_decoder_outputs
    assert torch.equal(ours.lm_head.weight, sd["lm_head.weight"])
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    src, sm, tgt, tm = _batch(0)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=sm, decoder_input_ids=tgt, decoder_attention_mask=tm).logits
        assert _close(ref, ours(src, sm, tgt, tm), tm.bool()) <= 1e-5


@pytest.mark.parametrize("name,change,field", [
    ("marian", {"normalize_before": True}, "normalize_before"),
    ("bart", {"add_final_layer_norm": True}, "add_final_layer_norm"),
    ("t5", {"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
    ("marian-two-vocabs", {"share_encoder_decoder_embeddings": True}, "decoder_vocab_size"),
])
def test_settings_we_would_get_wrong_are_refused(saved: dict[str, Path], tmp_path: Path, name: str,
                                                 change: dict, field: str) -> None:
    import shutil

    from training.checkpoint import CheckpointError, load_model

    shutil.copytree(saved[name], tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=field):
        load_model(tmp_path)


def test_base_model_checkpoint_loads_with_tied_head(tmp_path: Path) -> None:
    """bart-base ships as BartModel (no head, no final_logits_bias): the tied head and zero bias make it whole."""
    from training.checkpoint import load_model

    hf = _hf_model("bart")
    hf.model.save_pretrained(tmp_path)
    ours, _ = load_model(tmp_path)
    src, sm, tgt, tm = _batch(1)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=sm, decoder_input_ids=tgt, decoder_attention_mask=tm).logits
        assert _close(ref, ours(src, sm, tgt, tm), tm.bool()) <= 1e-5
