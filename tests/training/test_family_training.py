"""Short real runs of `python -m training ... --arch roberta|albert|distilbert|electra|llama` on tiny models: each learns
and writes an HF-layout checkpoint that `transformers` loads back with no missing weights."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from training.checkpoint import load_model
from training.tokenizer import TokenizerConfig, load_tokenizer, save_tokenizer, train_tokenizer

from tests.training_runs import MLM_ARGS, TINY, learned, pair_files, run_cli, train_losses

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def roberta_tok(root: Path, corpus: Path) -> Path:  # noqa: F811
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    return save_tokenizer(train_tokenizer(texts, TokenizerConfig(kind="roberta", vocab_size=1000)),
                          root / "tok-roberta", "roberta", 128)


@pytest.fixture(scope="module")
def wordpiece_tok(root: Path, corpus: Path) -> Path:  # noqa: F811
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    return save_tokenizer(train_tokenizer(texts, TokenizerConfig(kind="wordpiece", vocab_size=1000)),
                          root / "tok-wp-families", "wordpiece", 128)


def hf_loads(out: Path, auto: str) -> torch.nn.Module:
    """transformers.<auto>.from_pretrained(out) with every weight present (no missing / unexpected keys)."""
    model, info = getattr(transformers, auto).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def test_roberta_tokenizer_is_robertas(roberta_tok: Path) -> None:
    info = load_tokenizer(roberta_tok)
    assert info.kind == "roberta"
    assert (info.cls_id, info.pad_id, info.sep_id, info.unk_id, info.mask_id) == (0, 1, 2, 3, 4)
    pair = info.tokenizer.encode("To be", "or not")
    toks = pair.tokens
    assert toks[0] == "<s>" and toks.count("</s>") == 3 and toks[-1] == "</s>" and set(pair.type_ids) == {0}
    # <mask> swallows the space before it, like RoBERTa's: one token, no stray "Ġ" before it.
    enc = info.tokenizer.encode("to <mask> or")
    assert enc.ids[2] == info.mask_id and enc.tokens[1] == "to" and enc.tokens[3] == "Ġor" and len(enc.ids) == 5
    fast = transformers.AutoTokenizer.from_pretrained(roberta_tok)
    assert fast("to be <mask>")["input_ids"] == info.tokenizer.encode("to be <mask>").ids


def test_roberta_mlm_then_classify(root: Path, corpus: Path, roberta_tok: Path) -> None:  # noqa: F811
    mlm = root / "mlm-roberta"
    run_cli("mlm", "--arch", "roberta", "--tokenizer", roberta_tok, "--corpus", corpus, *TINY, *MLM_ARGS,
            "--steps", "12", "--eval-every", "0", "--out", mlm)
    assert learned(train_losses(mlm))
    cfg = json.loads((mlm / "config.json").read_text())
    assert cfg["architectures"] == ["RobertaForMaskedLM"] and cfg["model_type"] == "roberta"
    assert cfg["pad_token_id"] == 1 and cfg["max_position_embeddings"] >= 64 + 2
    ours, _ = load_model(mlm)
    hf = hf_loads(mlm, "AutoModelForMaskedLM")
    ids = torch.tensor([[0, 50, 4, 60, 2, 1, 1], [0, 70, 80, 4, 90, 100, 2]])
    mask = (ids != 1).long()
    with torch.no_grad():
        d = (ours(ids, mask) - hf(input_ids=ids, attention_mask=mask).logits).abs()[mask.bool()].max()
    assert float(d) <= 1e-5
    train, val, test = pair_files(root, corpus)
    clf = root / "clf-roberta"
    run_cli("classify", "--arch", "roberta", "--init", mlm, "--train", train, "--validation", val, "--test", test,
            "--batch-size", "16", "--max-length", "64", "--steps", "20", "--lr", "1e-3", "--warmup", "0",
            "--schedule", "constant", "--eval-every", "0", "--threads", "1", "--quiet", "--out", clf)
    assert learned(train_losses(clf))
    model, config = load_model(clf)
    assert type(model).__name__ == "RobertaForSequenceClassification" and config.id2label == {0: "next", 1: "odd"}
    hf_loads(clf, "AutoModelForSequenceClassification")


def test_roberta_refuses_nsp(root: Path, corpus: Path, roberta_tok: Path) -> None:  # noqa: F811
    r = run_cli("mlm", "--arch", "roberta", "--tokenizer", roberta_tok, "--corpus", corpus, *TINY,
                "--pair-objective", "nsp", "--steps", "1", "--out", root / "bad", check=False)
    assert r.returncode == 2 and "pair_objective" in r.stderr and "Traceback" not in r.stderr


def test_albert_sop_then_classify(root: Path, corpus: Path, wordpiece_tok: Path) -> None:  # noqa: F811
    mlm = root / "mlm-albert"
    run_cli("mlm", "--arch", "albert", "--tokenizer", wordpiece_tok, "--corpus", corpus, *TINY, *MLM_ARGS,
            "--steps", "12", "--eval-every", "0", "--out", mlm)
    assert learned(train_losses(mlm))
    cfg = json.loads((mlm / "config.json").read_text())
    assert cfg["architectures"] == ["AlbertForPreTraining"]  # ALBERT's default pair objective is SOP
    assert cfg["embedding_size"] < cfg["hidden_size"] and cfg["num_hidden_groups"] == 1
    hf_loads(mlm, "AlbertForPreTraining")
    fill, _ = load_model(mlm, kind="albert-mlm")  # the MLM part serves fill-mask
    assert type(fill).__name__ == "AlbertForMaskedLM"
    train, val, test = pair_files(root, corpus)
    clf = root / "clf-albert"
    run_cli("classify", "--arch", "albert", "--init", mlm, "--train", train, "--validation", val, "--test", test,
            "--batch-size", "16", "--max-length", "64", "--steps", "20", "--lr", "1e-3", "--warmup", "0",
            "--schedule", "constant", "--eval-every", "0", "--threads", "1", "--quiet", "--out", clf)
    model, _ = load_model(clf)
    assert type(model).__name__ == "AlbertForSequenceClassification"
    hf_loads(clf, "AutoModelForSequenceClassification")


def test_classify_arch_must_match_init(root: Path, corpus: Path, wordpiece_tok: Path) -> None:  # noqa: F811
    r = run_cli("classify", "--arch", "distilbert", "--threads", "1", "--out", root / "bad", check=False)
    assert r.returncode == 2 and "--init" in r.stderr and "Traceback" not in r.stderr


def _fine_tune_from_hf(root: Path, corpus: Path, wordpiece_tok: Path, arch: str, hf) -> Path:  # noqa: F811
    """Save `hf` (a transformers model, as the hub ships one) with our WordPiece tokenizer, fine-tune it with
    `classify --arch ARCH --init` on the pair data, and check the loss fell. Returns the classifier dir."""
    init = root / f"hf-{arch}"
    hf.save_pretrained(init)
    for f in wordpiece_tok.iterdir():
        (init / f.name).write_bytes(f.read_bytes())
    train, val, test = pair_files(root, corpus)
    clf = root / f"clf-{arch}"
    run_cli("classify", "--arch", arch, "--init", init, "--train", train, "--validation", val,
            "--test", test, "--batch-size", "16", "--max-length", "64", "--steps", "20", "--lr", "1e-3",
            "--warmup", "0", "--schedule", "constant", "--eval-every", "0", "--threads", "1", "--quiet",
            "--out", clf)
    assert learned(train_losses(clf))
    return clf


def test_distilbert_classify_from_hf_checkpoint(root: Path, corpus: Path, wordpiece_tok: Path) -> None:  # noqa: F811
    # An HF DistilBertForMaskedLM checkpoint (as distilbert-base-uncased ships), saved by transformers itself.
    vocab = load_tokenizer(wordpiece_tok).vocab_size
    hf = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
        vocab_size=vocab, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=128))
    clf = _fine_tune_from_hf(root, corpus, wordpiece_tok, "distilbert", hf)
    model, _ = load_model(clf)
    assert type(model).__name__ == "DistilBertForSequenceClassification"
    back = hf_loads(clf, "AutoModelForSequenceClassification")
    ids = torch.tensor([[2, 50, 60, 3, 0], [2, 70, 80, 90, 3]])
    mask = (ids != 0).long()
    with torch.no_grad():
        assert float((model(ids, mask) - back(input_ids=ids, attention_mask=mask).logits).abs().max()) <= 1e-5


def test_electra_classify_from_hf_checkpoint(root: Path, corpus: Path, wordpiece_tok: Path) -> None:  # noqa: F811
    # An HF ElectraForPreTraining checkpoint (what the released ELECTRA discriminators are), saved by transformers
    # itself, with E != H: its encoder is kept, the replaced-token head dropped, a classifier head starts fresh.
    vocab = load_tokenizer(wordpiece_tok).vocab_size
    hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        vocab_size=vocab, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=128))
    clf = _fine_tune_from_hf(root, corpus, wordpiece_tok, "electra", hf)
    model, config = load_model(clf)
    assert type(model).__name__ == "ElectraForSequenceClassification" and config.embedding_size == 32
    assert config.id2label == {0: "next", 1: "odd"}
    back = hf_loads(clf, "AutoModelForSequenceClassification")
    ids = torch.tensor([[2, 50, 60, 3, 0], [2, 70, 80, 90, 3]])
    mask = (ids != 0).long()
    types = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        got = model(ids, mask, types)
        assert float((got - back(input_ids=ids, attention_mask=mask, token_type_ids=types).logits).abs().max()) <= 1e-5
    # The encoder was fine-tuned from the discriminator's weights, not from a fresh init.
    start = hf.electra.embeddings_project.weight.detach()
    moved = float((model.electra.embeddings_project.weight.detach() - start).abs().max())
    assert 0 < moved < float(start.abs().max())
    r = run_cli("classify", "--arch", "electra", "--threads", "1", "--out", root / "bad-electra", check=False)
    assert r.returncode == 2 and "--init" in r.stderr and "Traceback" not in r.stderr


def test_llama_lm_learns_and_loads_in_transformers(root: Path, corpus: Path) -> None:  # noqa: F811
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    tok = save_tokenizer(train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=1000)), root / "tok-bpe-l",
                         "bpe", 128)
    out = root / "lm-llama"
    run_cli("lm", "--arch", "llama", "--tokenizer", tok, "--corpus", corpus, *TINY, "--lr", "2e-3", "--warmup", "0",
            "--schedule", "constant", "--steps", "12", "--eval-every", "0", "--eval-blocks", "8", "--out", out)
    assert learned(train_losses(out))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    ours, _ = load_model(out)
    hf = hf_loads(out, "AutoModelForCausalLM")
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 10, 11, 12]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got, _ = ours(ids, mask)
    assert float((ref - got).abs()[mask.bool()].max()) <= 1e-5
    m = json.loads((out / "metrics.json").read_text())
    assert 1.0 < m["test"]["perplexity"] < 1000.0
