"""Small random ModernBERT checkpoints saved by `transformers` (what a user brings), for the export and serving tests.

4 layers alternating global and local attention (global_attn_every_n_layers 2), a local window of 8 tokens (each
token sees 4 on either side) so the test texts, longer than that, exercise it; hidden 64, the WordPiece tokenizer
of the family tests (vocab ~400). initializer_range 0.2 (HF: 0.02): a random head then separates inputs clearly.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

LABELS = ["comedy", "history", "tragedy"]
TAGS = ["O", "B-PER", "I-PER"]
WINDOW = 8
# The first is far longer than the window, the last shorter than half of it: in the padded batch its pad rows sit
# more than half a window from any real token (rows a local layer lets see nothing).
TEXTS = ["Now is the winter of our discontent made glorious summer by this sun of York",
         "A horse! a horse! my kingdom for a horse!", "To be"]
HF_CLASSES = {"fill-mask": "ModernBertForMaskedLM", "classify": "ModernBertForSequenceClassification",
              "classify-mean": "ModernBertForSequenceClassification",
              "token-classify": "ModernBertForTokenClassification", "embed": "ModernBertModel"}


def hf_config(vocab: int, specials: dict[str, int], **extra: Any):
    import transformers

    return transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=64, local_attention=WINDOW, global_attn_every_n_layers=2,
        global_rope_theta=1000.0, local_rope_theta=100.0, initializer_range=0.2, pad_token_id=specials["[PAD]"],
        bos_token_id=specials["[CLS]"], cls_token_id=specials["[CLS]"], eos_token_id=specials["[SEP]"],
        sep_token_id=specials["[SEP]"], **extra)


def build_checkpoints(root: Path) -> dict[str, Path]:
    """One transformers-saved checkpoint per HF_CLASSES key, each with the WordPiece tokenizer files. "classify" pools
    the first token; "classify-mean" pools the mean and turns every bias switch on (norm, attention, MLP,
    classifier)."""
    import transformers
    from tokenizers import Tokenizer

    from tests.conftest import family_tokenizers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    tok_dir = family_tokenizers(root)["wordpiece"]
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    specials = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    extras: dict[str, dict[str, Any]] = {
        "classify": {"id2label": dict(enumerate(LABELS))},
        "classify-mean": {"id2label": dict(enumerate(LABELS)), "classifier_pooling": "mean", "norm_bias": True,
                          "attention_bias": True, "mlp_bias": True, "classifier_bias": True},
        "token-classify": {"id2label": dict(enumerate(TAGS))},
    }
    out = {}
    torch.manual_seed(0)
    for task, cls_name in HF_CLASSES.items():
        model = getattr(transformers, cls_name)(hf_config(tok.get_vocab_size(), specials, **extras.get(task, {})))
        out[task] = root / task
        model.eval().save_pretrained(out[task])
        for f in tok_dir.iterdir():
            (out[task] / f.name).write_bytes(f.read_bytes())
    return out


def padded_batch(ckpt: Path, texts: list[str], mask_word: str | None = None) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask from the checkpoint's tokenizer.json (what the server does);
    mask_word: that word of each text replaced by [MASK]."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    pad = json.loads((ckpt / "config.json").read_text())["pad_token_id"]
    if mask_word:
        texts = [t.replace(mask_word, "[MASK]") for t in texts]
    encs = [tok.encode(t).ids for t in texts]
    n = max(len(e) for e in encs)
    ids = torch.full((len(encs), n), pad)
    mask = torch.zeros((len(encs), n), dtype=torch.long)
    for i, e in enumerate(encs):
        ids[i, :len(e)], mask[i, :len(e)] = torch.tensor(e), 1
    return {"input_ids": ids, "attention_mask": mask}


def hf_logits(ckpt: Path, task: str, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' answer (SDPA, its default on CPU): logits, or the last hidden state for "embed"."""
    import transformers

    model = getattr(transformers, HF_CLASSES[task]).from_pretrained(ckpt).eval()
    with torch.no_grad():
        out = model(**feeds)
    return out.last_hidden_state if task == "embed" else out.logits


def st_embeddings(ckpt: Path, pooling: str, normalize: bool, texts: list[str]):
    """sentence-transformers' vectors for `texts`: the checkpoint's encoder, `pooling` ("cls" / "mean"), Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    word = Transformer(str(ckpt))
    modules = [word, Pooling(word.get_embedding_dimension(), pooling)] + ([Normalize()] if normalize else [])
    return SentenceTransformer(modules=modules, device="cpu").encode(texts, convert_to_numpy=True)
