"""A few Adam steps of next-token training on the synthetic corpus, for the tests whose decoders must not be random:
a random decoder's next-token distributions are so flat that quantized weights flip its greedy ids."""
from __future__ import annotations

import torch


def train_next_token(model: torch.nn.Module, tok, eot: int, steps: int = 100, lr: float = 3e-3) -> torch.nn.Module:
    """`steps` AdamW steps on batches of 16 windows of 32 tokens of the synthetic examples (never the gate's
    held-out sentences), each example followed by `eot`; returns the model in eval mode."""
    from tests.conftest import synthetic_examples

    stream: list[int] = []
    for text, _ in synthetic_examples(600, seed=1):
        stream += tok.encode(text).ids + [eot]
    data = torch.tensor(stream)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 33, (16,))
        batch = torch.stack([data[i:i + 33] for i in starts])
        logits = model(batch[:, :-1])[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
