"""training/m2m100.py and training/mbart.py against `transformers`: HF checkpoints (random small configs built by
transformers itself) load into ours and give its logits on a padded batch, ours save into checkpoints transformers
loads, and our greedy reference decoder equals its generate with a forced target language."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from testing.translation_checkpoints import hf_model, language_id, tokenizer
from training.checkpoint import checkpoint_kind, load_model, save_model
from training.seq2seq import generate_greedy

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def _batch(name: str, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer(name).encode(t).ids for t in ("a longer source", "hi", "mid")]
    rows[0][4] = pad     # a pad id among real tokens: M2M100 counts positions from the non-pad ones
    ids = torch.full((3, max(map(len, rows))), pad)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    return ids, mask


@pytest.mark.parametrize("name,kind", [("m2m100", "m2m100"), ("mbart", "mbart")])
def test_transformers_checkpoints_load_and_ours_load_into_transformers(tmp_path: Path, name: str, kind: str) -> None:
    hf = hf_model(name)
    hf.save_pretrained(tmp_path / "hf")
    assert checkpoint_kind(tmp_path / "hf") == kind
    ours, config = load_model(tmp_path / "hf")
    src, src_mask = _batch(name, config.pad_token_id)
    tgt = torch.tensor([[2, 50, 9, 10, 11], [2, 49, 12, 1, 1], [2, 48, 13, 14, 1]])
    tgt_mask = (tgt != config.pad_token_id).long()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                  decoder_attention_mask=tgt_mask).logits
        got = ours(src, src_mask, tgt, tgt_mask)
    for r in range(3):
        n = int(tgt_mask[r].sum())
        torch.testing.assert_close(got[r, :n], want[r, :n], atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 0.5
    save_model(ours, tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    with torch.no_grad():
        again = back(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                     decoder_attention_mask=tgt_mask).logits
    torch.testing.assert_close(again, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name,language", [("m2m100", "__fr__"), ("m2m100", "__de__"), ("mbart", "de_DE")])
def test_greedy_with_a_forced_language_equals_transformers_generate(tmp_path: Path, name: str, language: str) -> None:
    hf = hf_model(name)
    hf.save_pretrained(tmp_path / "hf")
    ours, config = load_model(tmp_path / "hf")
    config.forced_bos_token_id = language_id(name, language)
    src = torch.tensor([tokenizer(name).encode("the quick brown fox").ids])
    with torch.no_grad():
        want = hf.generate(input_ids=src, max_new_tokens=12, do_sample=False, num_beams=1,
                           forced_bos_token_id=config.forced_bos_token_id)[0, 1:].tolist()
        got = generate_greedy(ours, src, None, 12)[0].tolist()
    assert got == want and got[0] == language_id(name, language)
