"""Causal-LM pre-training of a GPT-2 or a Llama from a preset (`python -m training lm`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training import data as data_mod
from training.checkpoint import load_model
from training.gpt import GPT2LMHeadModel, GPTConfig
from training.llama import LlamaConfig, LlamaForCausalLM
from training.metrics import perplexity
from training.tokenizer import load_tokenizer

from .base import Batch, HeldOutTask, default_corpus, sample_capped, user_corpus

@dataclass
class LMConfig:
    """Causal LM pre-training of a GPT-2 from a preset."""

    tokenizer: str
    corpus: list[str] = field(default_factory=list)
    preset: str = "small"
    max_length: int = 128          # block size
    eval_blocks: int = 128
    arch: str = "gpt2"             # gpt2 | llama


LM_ARCHS = {"gpt2": "gpt", "llama": "llama"}


class LMTask(HeldOutTask):
    name = "lm"
    kind = "gpt"  # per instance: gpt | llama
    eval_key = "perplexity"
    higher_is_better = False

    def __init__(self, cfg: LMConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        if cfg.arch not in LM_ARCHS:
            raise data_mod.DataError(f"arch: the LM takes one of {', '.join(LM_ARCHS)}, got {cfg.arch!r}")
        self.kind = LM_ARCHS[cfg.arch]
        self.tok = load_tokenizer(cfg.tokenizer)
        if self.tok.kind != "bpe" or self.tok.eos_id is None:
            raise data_mod.DataError(f"{cfg.tokenizer}: tokenizer: the LM needs a byte-level BPE tokenizer "
                                     "with <|endoftext|>")
        corpus = user_corpus(cfg.corpus, seed=seed) if cfg.corpus else default_corpus()
        self.corpus_source = corpus.source
        self.train = self._blocks(corpus.train)
        if not self.train:
            raise data_mod.DataError(f"corpus: fewer than {cfg.max_length + 1} tokens to train on")
        self.held = {"validation": sample_capped(self._blocks(corpus.validation), cfg.eval_blocks, seed),
                     "test": sample_capped(self._blocks(corpus.test), cfg.eval_blocks, seed + 1)}

    def _blocks(self, docs: Sequence[str]) -> list[list[int]]:
        """Documents joined by <|endoftext|>, cut into blocks of max_length + 1 ids (inputs + next)."""
        if not docs:
            return []
        stream: list[int] = []
        for enc in self.tok.tokenizer.encode_batch(list(docs), add_special_tokens=False):
            stream += enc.ids
            stream.append(self.tok.eos_id)
        w = self.cfg.max_length + 1
        return [stream[i:i + w] for i in range(0, len(stream) - w + 1, self.cfg.max_length)]

    def build_model(self, resume: Path | None, dropout: float | None) -> nn.Module:
        if self.kind == "llama":
            over = {} if dropout is None else {"attention_dropout": dropout}
            if resume is not None:
                return load_model(resume, kind="llama", **over)[0]
            preset_pos = LlamaConfig.preset(self.cfg.preset, vocab_size=self.tok.vocab_size).max_position_embeddings
            # Tied head: at this vocab/width the head would otherwise be a third of the parameters.
            lconfig = LlamaConfig.preset(
                self.cfg.preset, vocab_size=self.tok.vocab_size, tie_word_embeddings=True,
                max_position_embeddings=max(preset_pos, self.cfg.max_length),
                bos_token_id=self.tok.bos_id, eos_token_id=self.tok.eos_id, **over)
            return LlamaForCausalLM(lconfig)
        over = {} if dropout is None else {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
        if resume is not None:
            model, _ = load_model(resume, kind="gpt", **over)
            return model
        preset_pos = GPTConfig.preset(self.cfg.preset, vocab_size=self.tok.vocab_size).n_positions
        config = GPTConfig.preset(
            self.cfg.preset, vocab_size=self.tok.vocab_size, n_positions=max(preset_pos, self.cfg.max_length),
            bos_token_id=self.tok.bos_id, eos_token_id=self.tok.eos_id, **over,
        )
        return GPT2LMHeadModel(config)

    def make_batch(self, indices: Sequence[int], seed: int) -> Batch:
        return {"ids": torch.tensor([self.train[i] for i in indices], dtype=torch.long)}

    def _nll(self, model: nn.Module, ids: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        x, y = ids[:, :-1], ids[:, 1:]
        logits, _ = model(x, torch.ones_like(x))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum", label_smoothing=label_smoothing)

    def loss(self, model: nn.Module, batch: Batch, rows: slice, label_smoothing: float) -> torch.Tensor:
        ids = batch["ids"]
        n = ids.shape[0] * (ids.shape[1] - 1)
        return self._nll(model, ids[rows], label_smoothing) / n

    def score(self, model: nn.Module, blocks: list, device: torch.device) -> dict[str, Any]:
        nll, n = 0.0, 0
        for start in range(0, len(blocks), 32):
            ids = torch.tensor(blocks[start:start + 32], dtype=torch.long, device=device)
            nll += float(self._nll(model, ids))
            n += ids.shape[0] * (ids.shape[1] - 1)
        # Perplexity depends on the vocabulary; bits per character of the predicted text does not, so runs with
        # different tokenizers compare on it.
        chars = sum(len(t) for t in self.tok.tokenizer.decode_batch([b[1:] for b in blocks],
                                                                    skip_special_tokens=False))
        return {"loss": nll / n, "perplexity": perplexity(nll, n), "bits_per_char": nll / math.log(2) / max(chars, 1),
                "tokens": n, "chars": chars, "blocks": len(blocks)}

    def summary(self) -> dict[str, Any]:
        return {"corpus": self.corpus_source, "train_blocks": len(self.train), "arch": self.cfg.arch,
                "heldout_blocks": {k: len(v) for k, v in self.held.items()}, "vocab_size": self.tok.vocab_size}
