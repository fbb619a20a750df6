"""Token classification (per-word labels) against `transformers`, for the five encoder families.

References are transformers' *ForTokenClassification models built from small random configs (no hub downloads),
saved with `save_pretrained` beside tokenizers trained on a small corpus (so rare words split into several
sub-tokens). Our modules equal HF's logits on a padded batch with multi-token words, our checkpoints load in
AutoModelForTokenClassification, and `python -m training token-classify` trains with labels on first sub-tokens.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

FAMILIES = ("bert", "roberta", "albert", "distilbert", "electra")
TOKEN_TYPE_FAMILIES = ("bert", "albert", "electra")
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
HF_CLASS = {"bert": "BertForTokenClassification", "roberta": "RobertaForTokenClassification",
            "albert": "AlbertForTokenClassification", "distilbert": "DistilBertForTokenClassification",
            "electra": "ElectraForTokenClassification"}
# Rare names split into several sub-tokens under a 400-token vocabulary; one text is much shorter (padding).
TEXTS = ["Benedick quarrelled with Dogberry in Messina", "Castle", "the king walked to Ravenspurgh, sadly!"]
# Served: punctuation glued to words, a non-ASCII word and a double space too (offsets are characters).
SERVED_TEXTS = ["Benedick quarrelled with Dogberry in Messina", "Castle",
                "the king walked to Ravenspurgh,  sadly! café Bolingbroke"]


def _hf_config(family: str, vocab: int, pad: int, **extra: Any):
    # initializer_range 0.2: a random head separates labels clearly, so equal answers mean something.
    small = dict(vocab_size=vocab, pad_token_id=pad, max_position_embeddings=64, initializer_range=0.2, **extra)
    if family == "bert":
        return transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, **small)
    if family == "roberta":
        return transformers.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, bos_token_id=0, eos_token_id=2, **small)
    if family == "albert":
        return transformers.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                         num_attention_heads=2, intermediate_size=64, **small)
    if family == "electra":
        return transformers.ElectraConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64, **small)
    return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, **small)


def build_token_checkpoints(root: Path) -> dict[str, Path]:
    """transformers-saved *ForTokenClassification checkpoints of the five families, with our tokenizers."""
    from tests.conftest import family_tokenizers

    toks = family_tokenizers(root)
    out = {}
    torch.manual_seed(0)
    for family in FAMILIES:
        tok_dir = toks["roberta" if family == "roberta" else "wordpiece"]
        tok = json.loads((tok_dir / "tokenizer.json").read_text())
        vocab = len(tok["model"]["vocab"]) + sum(1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"])
        cfg = _hf_config(family, vocab, 1 if family == "roberta" else 0, id2label=dict(enumerate(LABELS)))
        model = getattr(transformers, HF_CLASS[family])(cfg).eval()
        d = root / f"{family}-token"
        d.mkdir()
        for f in tok_dir.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        _spread_labels(model, family, d)
        model.save_pretrained(d)
        out[family] = d
    return out


def _spread_labels(model, family: str, ckpt: Path) -> None:
    """A random encoder's token states share one large common part, so a random head gives every token the same
    label. The head is re-drawn on the states' deviations from their mean over the test texts (the bias takes the
    mean out), scaled to logits of std 2: labels then change from token to token and every grouping rule is
    exercised."""
    feeds = encode(ckpt, TEXTS + SERVED_TEXTS)
    feeds["token_type_ids"] = torch.zeros_like(feeds["input_ids"])   # one segment, as the texts are served
    with torch.no_grad():
        hidden = hf_call(model.base_model, family, feeds).last_hidden_state[feeds["attention_mask"].bool()]
        centred = hidden - hidden.mean(0)
        w = torch.randn(len(LABELS), hidden.shape[1])
        w *= 2.0 / float((centred @ w.T).std())
        model.classifier.weight.copy_(w)
        model.classifier.bias.copy_(-(w @ hidden.mean(0)))


@pytest.fixture(scope="module")
def token_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_token_checkpoints(tmp_path_factory.mktemp("token_families"))


def encode(ckpt: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded batch from the checkpoint's tokenizer.json (what the server does)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    encs = [tok.encode(t) for t in texts]
    n = max(len(e.ids) for e in encs)
    ids = torch.full((len(encs), n), tok.token_to_id(cfg["pad_token"]))
    mask = torch.zeros((len(encs), n), dtype=torch.long)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)] = torch.tensor(e.ids), 1
    types = (torch.arange(n) >= 3).long() * mask   # a second segment: type 1 is exercised where the family has it
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def hf_call(hf, family: str, feeds: dict[str, torch.Tensor]):
    if family in TOKEN_TYPE_FAMILIES:
        return hf(**feeds)
    return hf(input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"])


def test_texts_have_multi_token_words(token_checkpoints) -> None:
    from tokenizers import Tokenizer

    for family in ("bert", "roberta"):
        tok = Tokenizer.from_file(str(token_checkpoints[family] / "tokenizer.json"))
        enc = tok.encode(TEXTS[0])
        words = [w for w in enc.word_ids if w is not None]
        assert len(words) > len(set(words)) + 2, (family, enc.tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_token_classifier_loads_and_matches(token_checkpoints, family: str) -> None:
    from training.checkpoint import checkpoint_kind, load_model

    ckpt = token_checkpoints[family]
    assert checkpoint_kind(ckpt) == f"{family}-token-classifier"
    ours, config = load_model(ckpt)   # HF's file, strictly: no missing or foreign keys
    assert [config.id2label[i] for i in range(len(LABELS))] == LABELS
    hf = getattr(transformers, HF_CLASS[family]).from_pretrained(ckpt).eval()
    feeds = encode(ckpt, TEXTS)
    real = feeds["attention_mask"].bool()
    assert (~real).any()
    with torch.no_grad():
        ref = hf_call(hf, family, feeds).logits
        got = hf_call(ours, family, feeds)
    assert got.shape == ref.shape == (*feeds["input_ids"].shape, len(LABELS))
    assert float((ref - got).abs()[real].max()) <= 1e-5
    with torch.no_grad():
        other = hf_call(ours, family, {**feeds, "input_ids": feeds["input_ids"].flip(0)})
    assert float((other - got).abs().max()) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_our_token_classifier_loads_in_transformers(token_checkpoints, tmp_path: Path, family: str) -> None:
    from training.checkpoint import load_model, save_model

    ours, _ = load_model(token_checkpoints[family])
    with torch.no_grad():  # every weight differs from the file it came from
        for p in ours.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model(ours, tmp_path / "ours")
    hf, info = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == HF_CLASS[family]
    assert hf.config.id2label == dict(enumerate(LABELS))
    feeds = encode(token_checkpoints[family], TEXTS)
    real = feeds["attention_mask"].bool()
    with torch.no_grad():
        d = (hf_call(hf.eval(), family, feeds).logits - hf_call(ours, family, feeds)).abs()
    assert float(d[real].max()) <= 1e-5


def test_sequence_classifier_lends_its_body_not_its_head(tmp_path: Path) -> None:
    from training.bert import BertConfig, BertForSequenceClassification
    from training.checkpoint import load_model, save_model

    seq = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=50, num_labels=5))
    save_model(seq, tmp_path / "seq")
    tok, _ = load_model(tmp_path / "seq", kind="bert-token-classifier", id2label=dict(enumerate(LABELS)))
    assert torch.equal(tok.bert.encoder.layer[0].attention.self.query.weight,
                       seq.bert.encoder.layer[0].attention.self.query.weight)
    assert not torch.equal(tok.classifier.weight, seq.classifier.weight)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_labels_sit_on_the_first_sub_token_of_each_word(token_checkpoints, family: str) -> None:
    from tokenizers import Tokenizer

    from training.token_data import IGNORE, WordsExample, align

    tok = Tokenizer.from_file(str(token_checkpoints[family] / "tokenizer.json"))
    words = TEXTS[0].split()
    tags = ["B-PER", "O", "O", "B-PER", "O", "B-LOC"]
    got = align(tok, WordsExample(tuple(words), tuple(tags)), {t: i for i, t in enumerate(LABELS)})
    # Reference: the tokenizer's own word ids of the pre-split words (HF's is_split_into_words recipe).
    enc = tok.encode(words, is_pretokenized=True, add_special_tokens=True)
    expected, last = [], None
    for w in enc.word_ids:
        expected.append(IGNORE if w is None or w == last else LABELS.index(tags[w]))
        last = w if w is not None else last
    if family == "bert":   # WordPiece: the same tokens either way
        assert got.ids == enc.ids
        assert got.labels == expected
    assert [LABELS[x] for x in got.labels if x != IGNORE] == tags
    assert got.words_kept == len(words) and len(got.labels) > len(words) + 2


def _synthetic_ner(path: Path, n: int, seed: int) -> None:
    """Keyword words are entities: a river/boat word B-LOC, a castle/crown word B-PER (the rest O)."""
    import random

    from tests.conftest import _FILLER, _KEYWORDS

    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            words, tags = [], []
            for _ in range(rng.randint(4, 9)):
                r = rng.random()
                if r < 0.2:
                    words.append(rng.choice(_KEYWORDS["alpha"])); tags.append("B-LOC")
                elif r < 0.4:
                    words.append(rng.choice(_KEYWORDS["beta"])); tags.append("B-PER")
                else:
                    words.append(rng.choice(_FILLER)); tags.append("O")
            f.write(json.dumps({"tokens": words, "labels": tags}) + "\n")


def test_training_cli_trains_a_token_classifier_that_transformers_loads(tiny_checkpoints, tmp_path: Path) -> None:
    _synthetic_ner(tmp_path / "train.jsonl", 300, 1)
    _synthetic_ner(tmp_path / "test.jsonl", 60, 2)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "training", "token-classify", "--init", str(tiny_checkpoints.mlm),
                           "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
                           "--out", str(out), "--steps", "60", "--batch-size", "16", "--lr", "3e-3", "--threads", "1",
                           "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    test = metrics["test"]
    base = metrics["data"]["majority_baseline_test"]
    assert metrics["data"]["labels"] == ["O", "B-LOC", "B-PER"]
    assert base["label"] == "O" and test["words"] == base["examples"]
    assert test["macro_f1"] > base["macro_f1"] + 0.3, (test, base)
    hf = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForTokenClassification"
    assert hf.config.id2label == {0: "O", 1: "B-LOC", 2: "B-PER"}


@pytest.mark.parametrize("row, field", [
    ({"tokens": ["a", "b"], "labels": ["O"]}, "field 'labels'"),
    ({"tokens": ["a b"], "labels": ["O"]}, "field 'tokens[0]'"),
    ({"text": "a b", "labels": ["O", "O"]}, "field 'tokens'"),
])
def test_training_cli_names_the_bad_field(tiny_checkpoints, tmp_path: Path, row: dict, field: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"tokens": ["x", "y"], "labels": ["O", "B-X"]}) + "\n" + json.dumps(row) + "\n")
    proc = subprocess.run([sys.executable, "-m", "training", "token-classify", "--init", str(tiny_checkpoints.mlm),
                           "--train", str(bad), "--out", str(tmp_path / "out"), "--steps", "1", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"bad.jsonl:2: {field}" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- export + parity gate


@pytest.fixture(scope="module")
def token_repository(token_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("token_repository")
    reports = {}
    with one_torch_thread():
        for family, ckpt in token_checkpoints.items():
            r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="token-classify", repository=repo,
                                               name=f"{family}-token", variants=("fp32",)))
            reports[family] = r.parity
    return repo, reports


@pytest.mark.parametrize("family", FAMILIES)
def test_export_passes_the_gate_and_equals_transformers(token_repository, token_checkpoints, family: str) -> None:
    import onnxruntime as ort
    from tests.conftest import one_torch_thread

    repo, reports = token_repository
    pkg = repo / f"{family}-token" / "1"
    m = json.loads((pkg / "model.json").read_text())
    assert reports[family]["passed"] and reports[family]["variants"]["fp32"]["passed"]
    assert m["task"] == "token-classify" and m["labels"] == LABELS and m["architecture"] == family
    assert m["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", "labels"]}]
    names = [i["name"] for i in m["inputs"]]
    assert names == (["input_ids", "attention_mask", "token_type_ids"] if family in TOKEN_TYPE_FAMILIES
                     else ["input_ids", "attention_mask"])
    feeds = encode(token_checkpoints[family], TEXTS)
    # One thread on each side: the sums' order (and their last bits) then does not depend on what else runs.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(pkg / m["variants"]["fp32"]), options, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {n: feeds[n].numpy() for n in names})[0]
    hf = getattr(transformers, HF_CLASS[family]).from_pretrained(token_checkpoints[family]).eval()
    with torch.no_grad(), one_torch_thread():
        ref = hf_call(hf, family, feeds).logits.numpy()
    real = feeds["attention_mask"].numpy().astype(bool)
    assert got.shape == ref.shape
    assert float(np.abs(got - ref)[real].max()) <= 1e-5


def test_validate_reruns_the_gate_on_a_token_package(token_repository) -> None:
    from export.validate import validate_package

    repo, _ = token_repository
    passed, table = validate_package(repo / "electra-token" / "1")
    assert passed, table


def test_gate_refuses_a_perturbed_token_graph(token_checkpoints, tmp_path: Path, monkeypatch) -> None:
    from export import ExportConfig, ParityFailure, export_checkpoint
    from export.model_builder import PERTURB_ENV

    monkeypatch.setenv(PERTURB_ENV, "fp32")
    with pytest.raises(ParityFailure):
        export_checkpoint(ExportConfig(checkpoint=token_checkpoints["distilbert"], task="token-classify",
                                       repository=tmp_path, name="bad", variants=("fp32",)))
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_export_names_a_checkpoint_without_a_token_head(tiny_checkpoints, tmp_path: Path) -> None:
    from export import ExportConfig, ExportError, export_checkpoint

    with pytest.raises(ExportError, match="--task token-classify: .*BertForTokenClassification"):
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.classifier, task="token-classify",
                                       repository=tmp_path, name="nohead"))


# ----------------------------------------------------------------------------- serving vs transformers' pipeline

STRATEGIES = ("none", "simple", "first", "average", "max")


def hf_pipeline(ckpt: Path):
    """transformers' own token-classification pipeline on the checkpoint, its tokenizer.json as a fast tokenizer."""
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    specials = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(ckpt / "tokenizer.json"), **specials)
    model = transformers.AutoModelForTokenClassification.from_pretrained(ckpt).eval()
    return transformers.pipeline("token-classification", model=model, tokenizer=tok, device="cpu")


def assert_same_entities(got: list[dict], ref: list[dict], where: str) -> None:
    """Equal entities: keys, labels, words, offsets and token positions exactly; scores within ONNX's error."""
    assert [set(g) for g in got] == [set(r) for r in ref], where
    for g, r in zip(got, ref):
        for k in r:
            if k == "score":
                assert abs(float(g[k]) - float(r[k])) <= 1e-4, (where, g, r)
            else:
                assert g[k] == r[k], (where, k, g, r)


@pytest.fixture(scope="module")
def token_server(token_repository):
    from tests.server_process import ServerProcess, wait_ready

    repo, _ = token_repository
    proc = ServerProcess(repo, ["--http-port", "0"])
    try:
        wait_ready(proc.address)
        yield proc
    finally:
        proc.stop()


def _entity_dicts(entities, strategy: str) -> list[dict]:
    out = []
    for e in entities:
        d = {"entity" if strategy == "none" else "entity_group": e.label, "score": e.score, "word": e.word,
             "start": e.start, "end": e.end}
        if strategy == "none":
            d["index"] = e.index
        out.append(d)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_served_entities_equal_the_transformers_pipeline(token_server, token_checkpoints, family: str) -> None:
    import httpx2 as httpx
    import tritonclient.http as thttp

    from clients.client import OrtserveClient

    pipe = hf_pipeline(token_checkpoints[family])
    name = f"{family}-token"
    with OrtserveClient(token_server.address) as client:
        for strategy in STRATEGIES:
            refs = [pipe(t, aggregation_strategy=strategy) for t in SERVED_TEXTS]
            assert any(refs), "the random model must label something other than O"
            # gRPC task API, through the client library
            got = client.token_classify(SERVED_TEXTS, name, aggregation_strategy=strategy)
            for text, g, r in zip(SERVED_TEXTS, got, refs):
                assert_same_entities(_entity_dicts(g, strategy), r, f"grpc {family} {strategy} {text!r}")
            # HTTP
            resp = httpx.post(f"{token_server.http_url}/v1/token-classify", timeout=60,
                              json={"model": name, "inputs": SERVED_TEXTS, "aggregation_strategy": strategy})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["labels"] == LABELS and body["aggregation_strategy"] == strategy
            for text, g, r in zip(SERVED_TEXTS, body["results"], refs):
                assert_same_entities(g, r, f"http {family} {strategy} {text!r}")
        # every label kept (ignore_labels=[]), on both doors
        refs = [pipe(t, aggregation_strategy="first", ignore_labels=[]) for t in SERVED_TEXTS]
        got = client.token_classify(SERVED_TEXTS, name, aggregation_strategy="first", ignore_labels=[])
        for g, r in zip(got, refs):
            assert_same_entities(_entity_dicts(g, "first"), r, "grpc keep all")
        none = [e["entity"] for t in SERVED_TEXTS for e in pipe(t, aggregation_strategy="none", ignore_labels=[])]
        assert len(set(none)) >= 3, none   # varied labels: the groupings differ from one run of one label
    # KServe text mode (REST): BYTES text in, per text a JSON list of the pipeline's entities out
    kc = thttp.InferenceServerClient(token_server.http_url.split("://", 1)[1])
    inp = thttp.InferInput("text", [len(SERVED_TEXTS)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in SERVED_TEXTS], dtype=object))
    res = kc.infer(name, [inp], parameters={"aggregation_strategy": "average"})
    answers = [json.loads(x) for x in res.as_numpy("entities")]
    for text, g in zip(SERVED_TEXTS, answers):
        assert_same_entities(g, pipe(text, aggregation_strategy="average"), f"kserve text {family}")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_kserve_tensor_mode_answers_the_logits(token_server, token_checkpoints, family: str) -> None:
    import tritonclient.grpc as tgrpc

    feeds = encode(token_checkpoints[family], TEXTS)
    names = ["input_ids", "attention_mask", "token_type_ids"][:3 if family in TOKEN_TYPE_FAMILIES else 2]
    client = tgrpc.InferenceServerClient(token_server.address)
    inputs = []
    for n in names:
        i = tgrpc.InferInput(n, list(feeds[n].shape), "INT64")
        i.set_data_from_numpy(feeds[n].numpy())
        inputs.append(i)
    logits = client.infer(f"{family}-token", inputs).as_numpy("logits")
    hf = getattr(transformers, HF_CLASS[family]).from_pretrained(token_checkpoints[family]).eval()
    with torch.no_grad():
        ref = hf_call(hf, family, feeds).logits.numpy()
    real = feeds["attention_mask"].numpy().astype(bool)
    assert logits.shape == ref.shape and float(np.abs(logits - ref)[real].max()) <= 1e-4


def test_bad_token_requests_name_the_field(token_server) -> None:
    import grpc
    import httpx2 as httpx

    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as pb_grpc

    with grpc.insecure_channel(token_server.address) as ch:
        stub = pb_grpc.TaskServiceStub(ch)
        cases = [
            (pb.TokenClassifyRequest(model="bert-token", texts=["a b"], aggregation_strategy="mean"),
             "aggregation_strategy"),
            (pb.TokenClassifyRequest(model="bert-token", texts=[]), "texts"),
            (pb.TokenClassifyRequest(model="bert-token", texts=["ok", "  "]), "texts[1]"),
            (pb.TokenClassifyRequest(model="bert-token", texts=["a"], ignore_labels=["O"], keep_all_labels=True),
             "keep_all_labels"),
            (pb.TokenClassifyRequest(model="bert-token", texts=["word " * 200]), "texts[0]"),
        ]
        for request, field in cases:
            with pytest.raises(grpc.RpcError) as err:
                stub.TokenClassify(request, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert err.value.details().startswith(field + ":"), err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.TokenClassify(pb.TokenClassifyRequest(model="nope", texts=["a"]), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # A long text is cut when asked to be
        ok = stub.TokenClassify(pb.TokenClassifyRequest(model="bert-token", texts=["word " * 200], truncate=True,
                                                        keep_all_labels=True), timeout=30)
        assert max(e.end for e in ok.results[0].entities) < 5 * 200
    url = f"{token_server.http_url}/v1/token-classify"
    for body, field in [({"model": "bert-token", "inputs": ["a"], "aggregation_strategy": "mean"}, "aggregation_strategy"),
                        ({"model": "bert-token", "inputs": []}, "inputs"),
                        ({"model": "bert-token", "inputs": ["a", 5]}, "inputs[1]"),
                        ({"model": "bert-token", "inputs": "a", "ignore_labels": "O"}, "ignore_labels"),
                        ({"inputs": "a"}, "model")]:
        resp = httpx.post(url, json=body, timeout=30)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["message"].startswith(field), resp.text
    resp = httpx.post(url, json={"model": "nope", "inputs": "a"}, timeout=30)
    assert resp.status_code == 404


# ----------------------------------------------------------------------------- punctuation & casing data


@pytest.mark.parametrize("raw, expected", [
    ("Sir,", ("sir", "B-Cap+COMMA")), ("lord.--", ("lord", "B-PERIOD")), ("Ay!", ("ay", "B-Cap+EXCLAIM")),
    ("'tis", ("'tis", "O")), ("(aside)", ("aside", "O")), ("KING;", ("king", "B-Cap+COMMA")), ("--", None),
    ("why?", ("why", "B-QUESTION")),
])
def test_punctuation_labels_come_from_the_text(raw: str, expected) -> None:
    from training.punctuation import word_label

    assert word_label(raw) == expected


def test_punctuation_examples_restore_their_text() -> None:
    from training.punctuation import LABELS, examples_of, restore

    text = "Who's there?\nWhat, my young master?--O my gentle master!\nNo more do yours; your virtues, gentle master,"
    (ex,) = examples_of(text, 40, "scene")
    assert ex.words[:6] == ("who's", "there", "what", "my", "young", "master")
    assert set(ex.labels) <= set(LABELS)
    assert restore(list(ex.words), list(ex.labels)) == (
        "Who's there? What, my young master? O my gentle master! No more do yours, your virtues, gentle master,")


def test_bare_text_is_what_the_restorer_trains_on() -> None:
    """The form int8 calibration and the benchmark feed the restorer: its training examples' words."""
    from training.punctuation import bare_text, examples_of

    text = "What, my young master?--O my gentle master! 'Tis well-born."
    assert bare_text(text) == "what my young master o my gentle master 'tis well-born"
    assert bare_text(text).split() == list(examples_of(text, 40, "scene")[0].words)


def test_punctuation_data_keeps_the_test_plays_apart() -> None:
    from training.punctuation import LABELS, punctuation_data

    d = punctuation_data()
    assert list(d.labels) == LABELS and LABELS[0] == "O" and len(LABELS) == 10
    train_words = {w for e in d.splits["train"][:2000] for w in e.words}
    assert all(len(e.words) <= 40 for s in d.splits.values() for e in s)
    seen = {t for e in d.splits["train"] for t in e.labels}
    assert seen == set(LABELS)   # every label occurs in training
    assert {e.source.split()[0] for e in d.splits["test"]} == {"test"} and train_words


def test_default_token_data_trains_without_train_files(tiny_checkpoints, tmp_path: Path) -> None:
    out = tmp_path / "punct"
    proc = subprocess.run([sys.executable, "-m", "training", "token-classify", "--init", str(tiny_checkpoints.mlm),
                           "--out", str(out), "--steps", "2", "--batch-size", "8", "--eval-examples", "20",
                           "--threads", "1", "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["data"]["labels"][0] == "O" and "B-Cap+COMMA" in m["data"]["labels"]
    assert m["data"]["majority_baseline_test"]["label"] == "O"
    assert m["test"]["words"] == m["data"]["majority_baseline_test"]["examples"] > 500


# ----------------------------------------------------------------------------- fuzzing the new request shapes


def test_fuzz_token_classify_rpc_http_and_kserve(token_server) -> None:
    """Random TokenClassify requests on every door: only the documented bad-input codes, consistent OK answers
    (offsets inside the text, in order; labels the model's), and a healthy server after."""
    import os

    import grpc
    import httpx2 as httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as pb_grpc

    examples = int(os.environ.get("ORTSERVE_FUZZ_EXAMPLES", "60"))
    fuzz = settings(max_examples=examples, deadline=None, database=None, derandomize=examples <= 100,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    tags = set(LABELS) | {t.split("-", 1)[-1] for t in LABELS}
    texts = st.one_of(st.text(min_size=1, max_size=120), st.sampled_from(SERVED_TEXTS + ["", " ", "\u200b", "a" * 700]))
    def mostly(usual, others):   # the usual value 3 times in 4: most cases reach the model
        return st.integers(0, 3).flatmap(lambda i: others if i == 3 else usual)

    strategies = mostly(st.sampled_from(STRATEGIES + ("",)), st.one_of(st.sampled_from(("MAX", "mean")),
                                                                      st.text(max_size=10)))
    models = mostly(st.sampled_from(["bert-token", "roberta-token"]), st.text(max_size=12))
    C = grpc.StatusCode
    seen: dict[str, set] = {"grpc": set(), "http": set(), "kserve": set()}

    def consistent(text: str, entities: list[tuple[str, int, int]]) -> None:
        last = 0
        for label, start, end in entities:
            assert label in tags and 0 <= start <= end <= len(text) and start >= last, (text, entities)
            last = start

    with grpc.insecure_channel(token_server.address) as ch:
        stub = pb_grpc.TaskServiceStub(ch)
        kserve = kserve_grpc.GRPCInferenceServiceStub(ch)

        @fuzz
        @given(model=models, version=mostly(st.just(0), st.sampled_from([1, 2, -1, 2 ** 62])),
               batch=st.lists(texts, max_size=5), strategy=strategies,
               ignore=mostly(st.just([]), st.lists(st.text(max_size=6), max_size=3)),
               keep=mostly(st.just(False), st.just(True)), truncate=st.booleans())
        def grpc_case(model, version, batch, strategy, ignore, keep, truncate) -> None:
            request = pb.TokenClassifyRequest(model=model, version=version, texts=batch, aggregation_strategy=strategy,
                                              ignore_labels=ignore, keep_all_labels=keep, truncate=truncate)
            try:
                answer = stub.TokenClassify(request, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() in (C.INVALID_ARGUMENT, C.NOT_FOUND), (exc.code(), exc.details())
                seen["grpc"].add(exc.code())
                return
            seen["grpc"].add(C.OK)
            assert len(answer.results) == len(batch)
            for text, r in zip(batch, answer.results):
                consistent(text, [(e.label, e.start, e.end) for e in r.entities])

        @fuzz
        @given(body=st.one_of(
            st.fixed_dictionaries({"model": models, "inputs": st.one_of(texts, st.lists(texts, max_size=4))},
                                  optional={"aggregation_strategy": strategies, "truncate": st.booleans(),
                                            "ignore_labels": st.lists(st.text(max_size=5), max_size=2)}),
            st.dictionaries(st.sampled_from(["model", "inputs", "aggregation_strategy", "ignore_labels", "x"]),
                            st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=2)),
                            max_size=4)))
        def http_case(body) -> None:
            resp = httpx.post(f"{token_server.http_url}/v1/token-classify", json=body, timeout=30)
            assert resp.status_code in (200, 400, 404), resp.text
            seen["http"].add(resp.status_code)
            if resp.status_code == 200:
                inputs = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
                for text, ents in zip(inputs, resp.json()["results"]):
                    consistent(text, [(e.get("entity", e.get("entity_group")), e["start"], e["end"]) for e in ents])
            else:
                assert resp.json()["error"]["message"]

        @fuzz
        @given(batch=st.lists(texts, min_size=1, max_size=3), params=st.dictionaries(
            st.sampled_from(["aggregation_strategy", "ignore_labels", "truncate"]),
            st.one_of(strategies, st.booleans(), st.integers(), st.sampled_from(['["O"]', "[]", "[1]", "{", "null"])),
            max_size=3))
        def kserve_case(batch, params) -> None:
            req = kserve_pb.ModelInferRequest(model_name="bert-token")
            t = req.inputs.add(name="text", datatype="BYTES", shape=[len(batch)])
            t.contents.bytes_contents.extend(x.encode("utf-8", "surrogatepass") for x in batch)
            for k, v in params.items():
                p = req.parameters[k]
                if isinstance(v, bool):
                    p.bool_param = v
                elif isinstance(v, int):
                    p.int64_param = v
                else:
                    p.string_param = v
            try:
                out = kserve.ModelInfer(req, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() == C.INVALID_ARGUMENT, (exc.code(), exc.details())
                seen["kserve"].add(exc.code())
                return
            seen["kserve"].add(C.OK)
            assert out.outputs[0].name == "entities" and out.outputs[0].shape == [len(batch)]

        grpc_case()
        http_case()
        kserve_case()
        assert seen["grpc"] >= {C.OK, C.INVALID_ARGUMENT}, seen
        assert seen["http"] >= {200, 400}, seen
        assert seen["kserve"] >= {C.OK, C.INVALID_ARGUMENT}, seen
        assert token_server.proc.poll() is None
        assert stub.TokenClassify(pb.TokenClassifyRequest(model="bert-token", texts=["a crown"]), timeout=10).results


def test_async_client_answers_as_the_sync_one(token_server) -> None:
    import asyncio

    from clients import AsyncOrtserveClient, OrtserveClient

    async def run():
        async with AsyncOrtserveClient(token_server.address) as client:
            return await client.token_classify(SERVED_TEXTS, "albert-token", aggregation_strategy="max")

    with OrtserveClient(token_server.address) as client:
        sync = client.token_classify(SERVED_TEXTS, "albert-token", aggregation_strategy="max")
    assert asyncio.run(run()) == sync and any(sync)
