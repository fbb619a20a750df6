"""Random encoders of the base models' shapes, built with `transformers` and saved once under a work folder, for the
peer benchmarks of the newer families (bench/embeddings.py --model, bench/classify_pipeline.py). Random weights: the
figures are of the shapes (compute, memory traffic), not of any released model's accuracy.

    xlmr        XLMRobertaModel, XLM-R base's encoder (12 layers x 768, 12 heads, FFN 3072, 514 positions, one token
                type), vocabulary cut to 8000 + <mask> (XLM-R's 250k only grows the embedding table a lookup
                reads); a Unigram tokenizer in XLMRobertaTokenizerFast's layout trained on the Shakespeare passages
                (tests/xlmr_models.py)
    modernbert  ModernBertModel, 12 layers x 768 (ModernBERT-base has 22), 12 heads, GeGLU FFN 1152, every third layer
                global and the rest a 128-token window, rotary theta 160000 / 10000 (ModernBERT-base's); MiniLM's
                WordPiece tokenizer (vocab 30522)
    deberta-v3  DebertaV2ForSequenceClassification, DeBERTa-v3-base's encoder (12 x 768, 12 heads, FFN 3072, 256
                position buckets, shared keys, relative positions only), vocabulary cut to 8000 (v3's 128k), a
                DeBERTa-v3-style Unigram tokenizer (tests/deberta_models.py) trained on the passages; its 3 labels
                are the genre task's (comedy / history / tragedy, training/data.py) and its top layers and head
                are trained TRAIN_STEPS steps on the task's train split, so its logits have margins: the export
                gate judges an int8 variant by top-1 agreement with fp32 and accuracy on the task's test plays,
                and a random head's near ties would refuse it by chance

The two embedders are saved as sentence-transformers saves a model (Transformer + mean Pooling + Normalize), which
`python -m export --task embed` reads and which infinity-emb and sentence-transformers load as they are.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from bench.material import minilm_tokenizer_dir, passages

# The DeBERTa classifier's fine-tuning on the genre task: enough steps for margins the int8 gate can read, few
# enough for 2 shared cores (batches of TRAIN_BATCH passages cut to TRAIN_TOKENS tokens; only the last
# TRAIN_LAYERS layers, the pooler and the classifier learn, the rest stays as initialised).
TRAIN_STEPS, TRAIN_BATCH, TRAIN_TOKENS, TRAIN_LAYERS, TRAIN_LR = 150, 8, 32, 2, 2e-4
log = logging.getLogger("bench.base_models")
SHAPES: dict[str, str] = {
    "xlmr": "random XLM-R base shape: XLMRobertaModel 12 layers x 768, 12 heads, FFN 3072, vocab 8000 + <mask> (Unigram "
            "tokenizer trained on the passages), mean pooling + normalize",
    "modernbert": "random ModernBERT base-like shape: ModernBertModel 12 layers x 768 (base: 22), 12 heads, GeGLU FFN "
                  "1152, global every 3rd layer, local window 128, MiniLM's WordPiece (30522), mean pooling + normalize",
    "deberta-v3": "DeBERTa-v3 base shape: DebertaV2ForSequenceClassification 12 layers x 768, 12 heads, FFN 3072, "
                  "256 position buckets, shared keys, vocab 8000 (Unigram tokenizer trained on the passages), random "
                  f"init, its last {TRAIN_LAYERS} layers and head trained {TRAIN_STEPS} steps on the genre task "
                  "(3 labels)",
}
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)


def _corpus() -> list[str]:
    return passages(3000, 40, seed=3)


def _xlmr(out: Path) -> Any:
    import transformers

    from tests.xlmr_models import unigram_tokenizer

    tok = unigram_tokenizer(out, vocab_size=8000, texts=_corpus())
    cfg = transformers.XLMRobertaConfig(vocab_size=len(tok), intermediate_size=3072, max_position_embeddings=514,
                                        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=tok.pad_token_id,
                                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **BASE)
    return transformers.XLMRobertaModel(cfg, add_pooling_layer=False)


def _set_max_length(folder: Path, n: int) -> None:
    """The longest input the peers tokenize (tokenizer_config.json's model_max_length, sentence-transformers'
    max_seq_length): 512, as the base models ship (XLM-R's 514 positions start after the padding index)."""
    for name, key in (("tokenizer_config.json", "model_max_length"), ("sentence_bert_config.json", "max_seq_length")):
        path = folder / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            cfg[key] = n
            path.write_text(json.dumps(cfg, indent=2))


def _modernbert(out: Path) -> Any:
    import transformers
    from tokenizers import Tokenizer

    src = minilm_tokenizer_dir(out.parent)
    for f in src.iterdir():
        shutil.copy2(f, out / f.name)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    cfg = transformers.ModernBertConfig(
        vocab_size=tok.get_vocab_size(), intermediate_size=1152, max_position_embeddings=512, local_attention=128,
        global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
        pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
        sep_token_id=ids["[SEP]"], **BASE)
    return transformers.ModernBertModel(cfg)


def _deberta_v3(out: Path) -> Any:
    import transformers

    from tests.deberta_models import unigram_tokenizer
    from training.data import GENRES

    tok_dir = out.parent / "tokenizer-deberta-v3"
    if not (tok_dir / "tokenizer.json").is_file():
        unigram_tokenizer(tok_dir, vocab_size=8000, texts=_corpus(), max_length=512)
    for f in tok_dir.iterdir():
        shutil.copy2(f, out / f.name)
    cfg = transformers.DebertaV2Config(
        vocab_size=8000, intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
        position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0, pad_token_id=0, layer_norm_eps=1e-7,
        id2label=dict(enumerate(GENRES)), **BASE)
    return transformers.DebertaV2ForSequenceClassification(cfg)


_BUILDERS: dict[str, Callable[[Path], Any]] = {"xlmr": _xlmr, "modernbert": _modernbert, "deberta-v3": _deberta_v3}


def checkpoint(work: Path, name: str) -> Path:
    """`name`'s checkpoint under work/NAME-base (built once, seed 0): a sentence-transformers folder for the
    embedders, a transformers classifier folder for deberta-v3."""
    import torch

    out = work / f"{name}-base"
    if (out / "config.json").is_file():
        return out
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(0)
    model = _BUILDERS[name](tmp).eval()
    if name == "deberta-v3":
        train_genre(model, tmp)
        model.save_pretrained(tmp)
    else:
        _save_sentence_transformer(model, tmp)
        _set_max_length(tmp, 512)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def train_genre(model: Any, folder: Path, steps: int = TRAIN_STEPS) -> None:
    """AdamW with a linear warm-up over the first tenth, on random batches of the genre task's train split,
    tokenized by the checkpoint's own tokenizer.json (labels by the model's id2label)."""
    import random

    import torch
    from tokenizers import Tokenizer

    from training.data import genre_data

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(TRAIN_TOKENS)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"))
    index = {label: i for i, label in model.config.id2label.items()}
    train = genre_data().splits["train"]
    rng = random.Random(0)
    layers = model.config.num_hidden_layers
    learned = ("pooler.", "classifier.", *(f"encoder.layer.{i}." for i in range(layers - TRAIN_LAYERS, layers)))
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(part in name for part in learned))
        if p.requires_grad:
            params.append(p)
    opt = torch.optim.AdamW(params, lr=TRAIN_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / max(1, steps // 10)))
    model.train()
    for step in range(steps):
        batch = rng.sample(train, TRAIN_BATCH)
        enc = tok.encode_batch([e.text for e in batch])
        loss = model(input_ids=torch.tensor([e.ids for e in enc]),
                     attention_mask=torch.tensor([e.attention_mask for e in enc]),
                     labels=torch.tensor([index[e.label] for e in batch])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0 or step == steps - 1:
            log.info("genre fine-tuning step %d/%d: loss %.3f", step + 1, steps, loss.item())
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()


def _save_sentence_transformer(model: Any, folder: Path) -> None:
    """The encoder saved with its tokenizer files, then reloaded as sentence-transformers' Transformer module with
    mean Pooling and Normalize and saved in place (modules.json, 1_Pooling, 2_Normalize)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    model.save_pretrained(folder)
    word = Transformer(str(folder))
    SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean"), Normalize()],
                        device="cpu").save(str(folder))
