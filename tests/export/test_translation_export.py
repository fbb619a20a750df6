"""Translation families (issue 39): M2M100 / NLLB-200 and mBART checkpoints exported as encoder.onnx + decoder.onnx
behind the parity gate, with the language tokens they accept listed in model.json.

Checkpoints are random Hugging Face models built by `transformers` from small configs, with language tokens in a
tiny tokenizer.json (testing/translation_checkpoints.py); the references are `transformers` itself (logits of a
padded batch, generate with forced_bos_token_id per target language), never the code under test. The ONNX side is
read with plain onnxruntime sessions (testing/seq2seq_offline.py).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from export import ExportConfig, ExportError, export_checkpoint
from modelpkg import Manifest, ManifestError
from testing import seq2seq_offline as offline
from testing.translation_checkpoints import MODELS, export_repository, hf_model, language_id, tokenizer, \
    write_checkpoint

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

NAMES = ["m2m100", "nllb", "mbart"]
WORDS = ["Shakespeare", "cat", "ortserve runs!", "a"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Each checkpoint exported once (the gate ran: publication means it passed)."""
    return export_repository(tmp_path_factory.mktemp("translation-export"), tuple(NAMES))


@pytest.mark.parametrize("name", NAMES)
def test_logits_of_a_padded_batch_equal_transformers(packages: dict[str, Path], name: str) -> None:
    """Sources of different lengths (one holding a pad id among its real tokens: M2M100 counts positions from the
    non-pad tokens) and targets of 5/2/7/3 in one padded batch, against transformers' forward with both masks."""
    pkg = offline.load_package(packages[name])
    spec = pkg.spec
    tok = tokenizer(name)
    sources = [tok.encode(w).ids for w in WORDS]
    sources[0][3] = spec.pad_token_id
    g = np.random.default_rng(7)
    targets = [[spec.decoder_start_token_id] + g.integers(3, spec.target_vocab_size, n - 1).tolist()
               for n in (5, 2, 7, 3)]
    (src, src_mask), (tgt, tgt_mask) = (offline.right_padded(rows, spec.pad_token_id) for rows in (sources, targets))
    with torch.no_grad():
        want = hf_model(name)(**{k: torch.from_numpy(v) for k, v in (
            ("input_ids", src), ("attention_mask", src_mask), ("decoder_input_ids", tgt),
            ("decoder_attention_mask", tgt_mask))}).logits.numpy()
    got = offline.padded_batch_logits(pkg, src, src_mask, tgt, tgt_mask)
    for r, t in enumerate(targets):
        np.testing.assert_allclose(got[r, :len(t)], want[r, :len(t)], atol=1e-4, rtol=1e-4)
    assert np.abs(want).max() > 0.5   # logits of a real size: a 1e-4 match means something


@pytest.mark.parametrize("name", NAMES)
def test_decoding_through_the_cache_equals_transformers(packages: dict[str, Path], name: str) -> None:
    """Targets starting with each target language, fed one token per call through the growing self cache (positions
    from the cache length): every step's logits equal transformers' full forward over the target."""
    pkg, model = offline.load_package(packages[name]), hf_model(name)
    source = torch.tensor([tokenizer(name).encode(WORDS[2]).ids])
    tail = np.random.default_rng(3).integers(3, pkg.spec.target_vocab_size, 12).tolist()
    for language in MODELS[name][3][1:]:
        target = [pkg.spec.decoder_start_token_id, language_id(name, language), *tail]
        with torch.no_grad():
            want = model(input_ids=source, decoder_input_ids=torch.tensor([target])).logits[0].numpy()
        got = offline.stepped_logits(pkg, source[0].tolist(), target)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=language)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_per_target_language_equals_transformers_forced_bos(packages: dict[str, Path], name: str) -> None:
    """Each target language forced first: the package's greedy ids equal transformers' generate on a padded batch
    with forced_bos_token_id = that language's token; the languages give different answers."""
    pkg = offline.load_package(packages[name])
    tok = tokenizer(name)
    sources = [tok.encode(w).ids for w in WORDS]
    src, mask = (torch.from_numpy(a) for a in offline.right_padded(sources, pkg.spec.pad_token_id))
    answers, model = [], hf_model(name)
    for language in MODELS[name][3][1:]:
        first = language_id(name, language)
        with torch.no_grad():
            want = model.generate(input_ids=src, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                           num_beams=1, forced_bos_token_id=first)[:, 1:].tolist()
        got = [offline.greedy(pkg, s, 10, forced_bos=first) for s in sources]
        for row, w in zip(got, want):
            assert row == w[:len(row)] and all(t == pkg.spec.pad_token_id for t in w[len(row):]), (language, row, w)
        answers.append([row[1:] for row in got])
    assert answers[0] != answers[1]


def test_manifest_lists_the_language_tokens(packages: dict[str, Path]) -> None:
    found = {name: Manifest.from_json((packages[name] / "model.json").read_text()).encoder_decoder for name in NAMES}
    for name, spec in found.items():
        assert spec.languages == {lang: language_id(name, lang) for lang in MODELS[name][3]}
    assert list(found["nllb"].languages) == ["eng_Latn", "fra_Latn", "deu_Latn"]
    assert [(found[n].source_language, found[n].source_language_index) for n in NAMES] == [
        ("__en__", 0), ("eng_Latn", 0), ("en_XX", 0)]
    m2m, mbart = found["m2m100"], found["mbart"]
    assert (m2m.family, m2m.max_source_length, m2m.decoder_start_token_id, m2m.forced_eos_token_id) == \
        ("m2m_100", 40, 2, None)
    assert (mbart.family, mbart.forced_eos_token_id, mbart.decoder_start_token_id) == ("mbart", 2, 2)
    good = json.loads((packages["mbart"] / "model.json").read_text())
    assert Manifest.from_dict(good).to_dict() == good   # round trip, languages included
    for bad in ({"fr_XX": 96}, {"": 49}, ["fr_XX"], {"fr_XX": "49"}):
        changed = {**good, "encoder_decoder": {**good["encoder_decoder"], "languages": bad}}
        with pytest.raises(ManifestError, match=r"encoder_decoder\.languages"):
            Manifest.from_dict(changed)
    parity = json.loads((packages["m2m100"] / "parity.json").read_text())
    names = [c["name"] for c in parity["variants"]["fp32"]["checks"]]
    assert parity["passed"] and "transformers M2M100ForConditionalGeneration: the ragged batch's logits" in names


def test_separate_encoder_and_decoder_tables_are_refused_by_name(tmp_path: Path) -> None:
    """transformers writes three different tables when tie_word_embeddings is false; our models share one."""
    cfg_cls, model_cls, kw, _ = MODELS["m2m100"]
    cfg = getattr(transformers, cfg_cls)(**{**kw, "tie_word_embeddings": False})
    torch.manual_seed(0)
    getattr(transformers, model_cls)(cfg).save_pretrained(tmp_path / "ckpt")
    tokenizer("m2m100").save(str(tmp_path / "ckpt" / "tokenizer.json"))
    with pytest.raises(ExportError, match="tie_word_embeddings: model.encoder.embed_tokens differs from model.shared"):
        export_checkpoint(ExportConfig(checkpoint=tmp_path / "ckpt", task="generate", repository=tmp_path / "repo",
                                       name="untied"))


def test_a_checkpoint_without_language_tokens_exports_with_no_languages(tmp_path: Path) -> None:
    ckpt = write_checkpoint("mbart", tmp_path / "ckpt")
    from testing.seq2seq_checkpoints import char_tokenizer
    from testing.translation_checkpoints import SPECIALS

    char_tokenizer(SPECIALS, MODELS["mbart"][2]["vocab_size"]).save(str(ckpt / "tokenizer.json"))
    pkg = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=tmp_path / "repo",
                                         name="plain")).package_dir
    spec = Manifest.from_json((pkg / "model.json").read_text()).encoder_decoder
    assert spec.languages == {} and "languages" not in json.loads((pkg / "model.json").read_text())["encoder_decoder"]


def test_the_source_language_is_found_where_the_post_processor_puts_it() -> None:
    """mbart-large-cc25 puts the source language after the text (`text </s> en_XX`), mBART-50 before it; a
    template without exactly one language token names none."""
    from tokenizers import processors

    from export.languages import language_tokens, source_language

    tok = tokenizer("mbart")
    languages = language_tokens(tok, "mbart", 96)
    assert source_language(tok, languages) == ("en_XX", 0)
    for single, want in (("$A </s> fr_XX", ("fr_XX", -1)), ("$A </s>", None), ("en_XX $A fr_XX", None)):
        specials = [(t, tok.token_to_id(t)) for t in single.split() if t != "$A"]
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
        assert source_language(tok, languages) == want, single
    assert language_tokens(tok, "bart", 96) == {}
