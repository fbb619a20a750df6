"""Pre-LayerNorm encoder-decoder blocks (fairseq's `normalize_before`), shared by M2M100 / NLLB (training/m2m100.py)
and mBART (training/mbart.py).

The parameters are Marian's and BART's, under the same Hugging Face names (self_attn, self_attn_layer_norm,
encoder_attn, encoder_attn_layer_norm, fc1, fc2, final_layer_norm); only the order differs: each sublayer reads
the NORMED input and adds its output to the un-normed residual, and each stack ends with a LayerNorm of its own
(`layer_norm`): the stack mixins below.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.marian import MarianDecoderLayer, MarianEncoderLayer
from training.seq2seq import KV


class PreNormEncoderLayer(MarianEncoderLayer):
    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        h = self.self_attn_layer_norm(x)
        x = x + self.dropout(self.self_attn(h, allowed, self.self_attn.project_kv(h)))
        h = self.final_layer_norm(x)
        return x + self.dropout(self.fc2(self.activation_dropout(self.act(self.fc1(h)))))


class PreNormDecoderLayer(MarianDecoderLayer):
    def forward(self, x: torch.Tensor, self_allowed: torch.Tensor, past: KV, cross: KV,
                cross_allowed: torch.Tensor) -> tuple[torch.Tensor, KV]:
        h = self.self_attn_layer_norm(x)
        k, v = self.self_attn.project_kv(h)
        present = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        x = x + self.dropout(self.self_attn(h, self_allowed, present))
        x = x + self.dropout(self.encoder_attn(self.encoder_attn_layer_norm(x), cross_allowed, cross))
        h = self.final_layer_norm(x)
        return x + self.dropout(self.fc2(self.activation_dropout(self.act(self.fc1(h))))), present


class PreNormEncoderStack:
    """Mixin before a MarianEncoder subclass: pre-norm layers, and the stack's final `layer_norm` on its output."""

    layer_class = PreNormEncoderLayer

    def __init__(self, config: Any, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)  # type: ignore[call-arg]
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.layer_norm(super().forward(input_ids, attention_mask))  # type: ignore[misc]


class PreNormDecoderStack:
    """Mixin before a MarianDecoder subclass: pre-norm layers, and the stack's final `layer_norm` on its output."""

    layer_class = PreNormDecoderLayer

    def __init__(self, config: Any, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)  # type: ignore[call-arg]
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, ids: torch.Tensor, cross: list[KV], encoder_attention_mask: torch.Tensor | None,
                decoder_attention_mask: torch.Tensor | None, past_key_values: list[KV]
                ) -> tuple[torch.Tensor, list[KV]]:
        x, presents = super().forward(ids, cross, encoder_attention_mask,  # type: ignore[misc]
                                      decoder_attention_mask, past_key_values)
        return self.layer_norm(x), presents
