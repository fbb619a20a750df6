"""A tiny cross-encoder for the rerank tests: BertForSequenceClassification with ONE label, trained a few steps on
pairs (query, document) of synthetic sentences to score a document high when its keywords are of the "beta" group
(king, castle, crown, ...; conftest's keyword task), so that its scores spread and rankings are not ties. (A tiny
model learns this in a few steps; matching the query's group across segments takes far more.) An HF-layout
checkpoint that sentence-transformers' CrossEncoder loads as it is."""
from __future__ import annotations

import random
from pathlib import Path


def build_cross_encoder(tiny_checkpoints, root: Path, steps: int = 80) -> Path:
    import torch
    from tests.conftest import TINY_LABELS, one_torch_thread, synthetic_sentence
    from tokenizers import Tokenizer

    from training.bert import BertConfig, BertForSequenceClassification
    from training.checkpoint import save_model

    source = tiny_checkpoints.classifier       # its WordPiece tokenizer files, as they are
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    rng = random.Random(5)
    with one_torch_thread():
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tokenizer.get_vocab_size(),
                                                                id2label={0: "relevance"}))
        pad = tokenizer.token_to_id("[PAD]")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            pairs, labels = [], []
            for _ in range(32):
                a, b = rng.choice(TINY_LABELS), rng.choice(TINY_LABELS)
                pairs.append((synthetic_sentence(rng, a), synthetic_sentence(rng, b)))
                labels.append(float(b == "beta"))
            encs = tokenizer.encode_batch(pairs)
            n = max(len(e.ids) for e in encs)
            ids = torch.tensor([e.ids + [pad] * (n - len(e.ids)) for e in encs])
            types = torch.tensor([e.type_ids + [0] * (n - len(e.ids)) for e in encs])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(ids, (ids != pad).long(), types)[:, 0], torch.tensor(labels))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        files = {p.name: p for p in source.iterdir() if p.is_file() and not p.name.startswith(("model", "config"))}
        return save_model(model, root / "cross-encoder", tokenizer_files=files)


def add_tiny_embed(tiny_checkpoints, repository: Path, name: str = "tiny-embed") -> Path:
    """The tiny MLM checkpoint exported as an embedding model (cls pooling, not normalized, 64 values, no
    Matryoshka declaration) into `repository`: a cheap scorer (cosine) for the fuzzers (~2 s)."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repository,
                                       name=name, pooling="cls", normalize="off"))
    return repository
