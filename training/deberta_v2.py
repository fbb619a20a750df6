"""DeBERTa-v2 / v3 encoder with Hugging Face parameter names (transformers' DebertaV2Model and its parts).

DeBERTa keeps BERT's post-LN layer (attention, residual + LayerNorm, FFN, residual + LayerNorm) and changes the
attention: besides content-to-content (q . k) a layer adds, per `pos_att_type`,
- c2p, content-to-position: the query against a projected relative-distance embedding, q_i . Pk[d(i, j)];
- p2c, position-to-content: the key against a projected relative-distance embedding, k_j . Pq[d'(j, i)];
all divided by sqrt(head_dim x (1 + number of those terms)). Distances are relative (i - j), mapped to
`position_buckets` log-spaced buckets (exact within half the buckets, logarithmic beyond, up to
`max_relative_positions`) and clipped into the table of 2 x buckets rows (`encoder.rel_embeddings`, LayerNormed
when `norm_rel_ebd` says "layer_norm"). With `share_att_key` the content projections also project the distances;
otherwise `pos_key_proj` / `pos_query_proj` do.
- v3 (`position_biased_input` false): no absolute position table at all; v2: absolute positions added as BERT does.
- `type_vocab_size` 0 (both released generations): no token-type table; the graph then takes no token_type_ids.
- `conv_kernel_size` > 0 (v2-xlarge/xxlarge): a 1-D convolution over the embeddings joins the first layer's output.
- the padding mask is applied to the embeddings and, as a [query x key] product, to every attention.

Relative distances are looked up, not computed from a float log at run time: the bucket of every distance the
model can meet (|i - j| < max_position_embeddings) is worked out once, in torch, with the maths transformers uses,
and stored as two small index tables (c2p and p2c, already shifted and clipped). The graph gathers from them with
indices built from the run's own sequence length, so an exported graph serves any length up to the model's, and
no ceil(log(...)) can land on the other side of an integer in another runtime's log.

The heads (classifier, token classifier, masked LM) are training/deberta_v2_heads.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import BertConfig, BertLayer, BertSelfOutput, activation
from training.weight_init import init_weights

POS_ATT_TYPES = ("c2p", "p2c")


def act(name: str):
    """pooler_hidden_act / conv_act / hidden_act: BERT's activations plus the tanh DeBERTa's conv uses."""
    return torch.tanh if name == "tanh" else activation(name)


@dataclass
class DebertaV2Config(BertConfig):
    """HF's DebertaV2Config keys and defaults (microsoft/deberta-v2-xlarge's sizes), plus the keys transformers
    reads with getattr (position_buckets, share_att_key, norm_rel_ebd, conv_*, embedding_size)."""

    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    position_biased_input: bool = True
    pos_att_type: list[str] | str | None = None
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    pooler_hidden_size: int | None = None
    cls_dropout: float | None = None
    legacy: bool = True
    tie_word_embeddings: bool = True
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    embedding_size: int | None = None
    attention_head_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pos_att_type, str):   # HF accepts "p2c|c2p"
            self.pos_att_type = [x.strip() for x in self.pos_att_type.lower().split("|")]
        self.pos_att_type = list(self.pos_att_type or [])
        unknown = [t for t in self.pos_att_type if t not in POS_ATT_TYPES]
        if unknown:
            raise ValueError(f"pos_att_type: unsupported {unknown} (any of {list(POS_ATT_TYPES)})")
        if self.attention_head_size is not None and self.attention_head_size * self.num_attention_heads \
                != self.hidden_size:
            raise ValueError(f"attention_head_size: {self.attention_head_size} x {self.num_attention_heads} heads "
                             f"!= hidden_size {self.hidden_size} is not supported")
        if self.pooler_hidden_size is None:
            self.pooler_hidden_size = self.hidden_size
        if self.pooler_hidden_size != self.hidden_size:
            raise ValueError(f"pooler_hidden_size: {self.pooler_hidden_size} != hidden_size {self.hidden_size} "
                             "is not supported")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.relative_attention and 0 < self.position_buckets < 2:
            raise ValueError(f"position_buckets: {self.position_buckets} is too few (at least 2)")
        super().__post_init__()
        act(self.pooler_hidden_act)
        act(self.conv_act)

    @property
    def norm_rel(self) -> bool:
        return "layer_norm" in [x.strip() for x in self.norm_rel_ebd.lower().split("|")]

    @property
    def max_relative(self) -> int:
        """The distance bucketing saturates at (max_position_embeddings when the config leaves it unset)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def att_span(self) -> int:
        """Half the relative-embedding rows: the buckets, or every distance up to max_relative."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    def to_hf_dict(self) -> dict[str, Any]:
        """BERT's dict (from_hf_dict is BERT's too) with DeBERTa's model_type, its own tie_word_embeddings, and
        the keys transformers reads with getattr left out when unset (a null would replace its default)."""
        d = super().to_hf_dict()
        del d["position_embedding_type"]
        for key in ("classifier_dropout", "cls_dropout", "attention_head_size"):
            if d.get(key) is None:
                d.pop(key, None)
        d.update(model_type="deberta-v2", tie_word_embeddings=self.tie_word_embeddings)
        return d


def log_bucket(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's bucket of each relative distance (int64 -> int64): exact while |d| < buckets / 2, then
    ceil(log(|d| / mid) / log((max_position - 1) / mid) x (mid - 1)) + mid with d's sign (the float32 maths of
    transformers' make_log_bucket_position, so the tables equal its buckets)."""
    mid = buckets // 2
    near = (distance < mid) & (distance > -mid)
    magnitude = torch.where(near, torch.full_like(distance, mid - 1), distance.abs())
    span = torch.log(torch.tensor((max_position - 1) / mid))
    far = torch.ceil(torch.log(magnitude / mid) / span * (mid - 1)) + mid
    return torch.where(magnitude <= mid, distance.to(far.dtype), far * torch.sign(distance)).long()


def relative_index_tables(config: DebertaV2Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(c2p, p2c) rows of the relative embedding for every distance d = i - j in [-(L - 1), L - 1] (entry d + L - 1),
    L = max_position_embeddings: c2p's clip(bucket(d) + span), p2c's clip(span - bucket(d)), as transformers
    clips them into [0, 2 x span)."""
    n = config.max_position_embeddings
    distance = torch.arange(-(n - 1), n, dtype=torch.long)
    if config.position_buckets > 0:
        distance = log_bucket(distance, config.position_buckets, config.max_relative)
    span = config.att_span
    return (torch.clamp(distance + span, 0, 2 * span - 1), torch.clamp(span - distance, 0, 2 * span - 1))


class DebertaV2Embeddings(nn.Module):
    """Word (+ absolute position when position_biased_input) (+ token type when type_vocab_size > 0), the E -> H
    projection when embedding_size differs, LayerNorm, zeroed at padding."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        e = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, e)
                                    if config.position_biased_input else None)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size > 0 else None
        self.embed_proj = nn.Linear(e, config.hidden_size, bias=False) if e != config.hidden_size else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(self.position_ids[:, :input_ids.size(1)])
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        x = self.LayerNorm(x) * mask.unsqueeze(-1).to(x.dtype)
        return self.dropout(x)


class DisentangledSelfAttention(nn.Module):
    """Content-to-content plus the c2p / p2c terms of pos_att_type (module docstring), on [B, heads, S, D]."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        h = config.hidden_size
        self.query_proj = nn.Linear(h, h)
        self.key_proj = nn.Linear(h, h)
        self.value_proj = nn.Linear(h, h)
        self.pos_att_type = tuple(config.pos_att_type)
        self.relative_attention = config.relative_attention
        self.share_att_key = config.share_att_key
        if self.relative_attention and not self.share_att_key:
            if "c2p" in self.pos_att_type:
                self.pos_key_proj = nn.Linear(h, h)
            if "p2c" in self.pos_att_type:
                self.pos_query_proj = nn.Linear(h, h)
        # transformers divides by sqrt(D x (1 + terms)) computed in float32, whether or not relative attention is on
        self.register_buffer("scale", torch.sqrt(torch.tensor(float(self.head_dim * (1 + len(self.pos_att_type))))),
                             persistent=False)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [..., S, hidden] -> [..., heads, S, D]
        x = x.view(x.size()[:-1] + (self.num_heads, self.head_dim))
        return x.transpose(-3, -2)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, rel_embeddings: torch.Tensor | None,
                c2p_index: torch.Tensor | None, p2c_index: torch.Tensor | None) -> torch.Tensor:
        """mask: bool [B, 1, S, S]; c2p_index / p2c_index: int64 [S, S] rows of rel_embeddings per (i, j)."""
        q = self._heads(self.query_proj(hidden))
        k = self._heads(self.key_proj(hidden))
        v = self._heads(self.value_proj(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2) / self.scale)
        if self.relative_attention and self.pos_att_type:
            scores = scores + self._position_scores(q, k, self.pos_dropout(rel_embeddings), c2p_index, p2c_index)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).transpose(1, 2).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.num_heads * self.head_dim,))

    def _position_scores(self, q: torch.Tensor, k: torch.Tensor, rel: torch.Tensor, c2p_index: torch.Tensor,
                         p2c_index: torch.Tensor) -> torch.Tensor:
        full = q.shape[:-1] + (q.size(-2),)   # [B, heads, S, S]
        score = torch.zeros((), dtype=q.dtype)
        if "c2p" in self.pos_att_type:
            proj = self.key_proj if self.share_att_key else self.pos_key_proj
            pos_key = self._heads(proj(rel))                                  # [heads, 2 span, D]
            c2p = torch.matmul(q, pos_key.transpose(-1, -2))                  # [B, heads, S, 2 span]
            score = score + torch.gather(c2p, -1, c2p_index.expand(full)) / self.scale
        if "p2c" in self.pos_att_type:
            proj = self.query_proj if self.share_att_key else self.pos_query_proj
            pos_query = self._heads(proj(rel))
            p2c = torch.matmul(k, pos_query.transpose(-1, -2))                # [B, heads, S (keys), 2 span]
            # row j, column i: key j against the embedding of distance j - i's p2c entry; transposed to [i, j]
            score = score + torch.gather(p2c, -1, p2c_index.expand(full)).transpose(-1, -2) / self.scale
        return score


class DebertaV2Attention(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = BertSelfOutput(config)     # HF's DebertaV2SelfOutput: BERT's parts, names and order

    def forward(self, hidden: torch.Tensor, context: tuple[Any, ...]) -> torch.Tensor:
        """context: (mask, rel_embeddings, c2p_index, p2c_index), passed whole through BertLayer."""
        return self.output(self.self(hidden, *context), hidden)


class DebertaV2Layer(BertLayer):
    """BERT's post-LN layer (its intermediate and output modules, HF's names) around the disentangled attention."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.attention = DebertaV2Attention(config)


class ConvLayer(nn.Module):
    """conv_kernel_size > 0: Conv1d over the embeddings (padding positions zeroed), conv_act, added to the first
    layer's output, LayerNorm, zeroed at padding."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2,
                              groups=config.conv_groups)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.act = act(config.conv_act)

    def forward(self, embedded: torch.Tensor, layer_out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.unsqueeze(-1).to(embedded.dtype)
        out = self.conv(embedded.transpose(1, 2)).transpose(1, 2) * keep
        out = self.act(self.dropout(out))
        return self.LayerNorm(layer_out + out) * keep


class DebertaV2Encoder(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers))
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.att_span, config.hidden_size)
            c2p, p2c = relative_index_tables(config)
            self.register_buffer("c2p_table", c2p, persistent=False)
            self.register_buffer("p2c_table", p2c, persistent=False)
        if config.norm_rel:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.conv = ConvLayer(config) if config.conv_kernel_size > 0 else None

    def _relative(self, seq: int) -> tuple[torch.Tensor | None, ...]:
        if not self.config.relative_attention:
            return None, None, None
        rel = self.rel_embeddings.weight
        if self.config.norm_rel:
            rel = self.LayerNorm(rel)
        pos = torch.arange(seq)
        # entry (i - j) + L - 1 of the tables, built from this run's length: no length is fixed in an export
        index = pos.unsqueeze(1) - pos.unsqueeze(0) + (self.config.max_position_embeddings - 1)
        return rel, self.c2p_table[index], self.p2c_table[index]

    def forward(self, embedded: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = embedded.size(1)
        if seq > self.config.max_position_embeddings:
            raise ValueError(f"input_ids: {seq} tokens > max_position_embeddings {self.config.max_position_embeddings}")
        keep = attention_mask.bool()
        mask = (keep.unsqueeze(1) & keep.unsqueeze(2)).unsqueeze(1)    # [B, 1, S, S]: query and key both real
        relative = self._relative(seq)
        hidden = embedded
        for i, layer in enumerate(self.layer):
            hidden = layer(hidden, (mask, *relative))
            if i == 0 and self.conv is not None:
                hidden = self.conv(embedded, hidden, attention_mask)
        return hidden


class DebertaV2Model(nn.Module):
    """Embeddings + the disentangled-attention encoder; no pooler (the classifier's ContextPooler is its own)."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config)
        self.config = config
        for module in self.modules():   # HF's init: normal(initializer_range), zero biases, unit LayerNorms
            init_weights(module, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, H] (no mask: every token real; no types: type 0, as transformers)."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        return self.encoder(self.embeddings(input_ids, types, mask), mask)

    def states(self, *args: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): (hidden states, no pooled vector)."""
        return self(*args), None
