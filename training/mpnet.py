"""MPNet (sentence-transformers' all-mpnet-base-v2, multi-qa-mpnet-base-*, and MPNet fine-tunes) under Hugging Face
parameter names.

What differs from BERT (training/bert.py, whose feed-forward parts are reused) and RoBERTa (training/roberta.py,
whose heads are reused):
- positions as RoBERTa's: real tokens count from the padding index + 1, pad tokens sit at the padding index. The
  padding index is token id 1 whatever the config says (transformers hard-codes it): a config naming another pad
  token is refused by name rather than served with positions its tokenizer never meant;
- no token types;
- one relative-position bias table `encoder.relative_attention_bias` [buckets, heads], looked up once per forward
  with T5's bidirectional buckets (32 buckets, max distance 128: transformers' fixed arguments) and added to the
  attention scores of every layer;
- attention projections named `attention.attn.{q,k,v,o}` with the residual norm at `attention.LayerNorm`;
- heads: the masked LM is RoBERTa's `lm_head` (dense -> exact GELU -> layer_norm -> decoder tied to the word
  embeddings), the sentence classifier RoBERTa's `classifier` (dense -> tanh -> out_proj on <s>), the token
  classifier dropout + `classifier`; all drop with hidden_dropout_prob (MPNet has no classifier_dropout).

The bucket of every relative distance the position table allows is computed once, in torch, at construction, and
the forward pass only indexes it: the exported graph holds no logarithm whose last-ulp rounding in onnxruntime could
move a distance into the neighbouring bucket at the exact boundaries (16, 32, 64 tokens apart).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import BertConfig, BertIntermediate, BertOutput
from training.heads import MaskedLM, ProjectedClassifier, TokenClassifier
from training.roberta import RobertaLMHead
from training.weight_init import init_weights

MODEL_TYPE = "mpnet"
PADDING_IDX = 1          # transformers' MPNetEmbeddings: fixed, not config.pad_token_id
NUM_BUCKETS = 32         # transformers' compute_position_bias(num_buckets=32)
MAX_DISTANCE = 128       # relative_position_bucket(max_distance=128)


@dataclass
class MPNetConfig(BertConfig):
    """transformers' MPNetConfig fields and defaults (BERT's sizes, one relative-position bias table)."""

    vocab_size: int = 30527
    layer_norm_eps: float = 1e-12
    pad_token_id: int = PADDING_IDX
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    relative_attention_num_buckets: int = NUM_BUCKETS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pad_token_id != PADDING_IDX:
            raise ValueError(f"pad_token_id: MPNet counts positions from token id {PADDING_IDX} (transformers "
                             f"hard-codes it), got {self.pad_token_id}")
        if self.relative_attention_num_buckets != NUM_BUCKETS:
            raise ValueError(f"relative_attention_num_buckets: transformers buckets distances into "
                             f"{NUM_BUCKETS} whatever the table's size; only {NUM_BUCKETS} is supported, got "
                             f"{self.relative_attention_num_buckets}")
        if self.classifier_dropout is not None:   # transformers' MPNet heads never read it
            self.classifier_dropout = None

    @property
    def max_tokens(self) -> int:
        """Longest sequence the position table allows (positions start at the padding index + 1)."""
        return self.max_position_embeddings - PADDING_IDX - 1

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "MPNetConfig":
        if d.get("tie_word_embeddings") is False:
            raise ValueError("tie_word_embeddings: only a masked-LM decoder tied to the word embeddings is "
                             "supported")
        names = {f.name for f in dataclasses.fields(cls)} - {"type_vocab_size", "classifier_dropout"}
        kw = {k: v for k, v in d.items() if k in names and not (k.endswith("_token_id") and v is None)}
        if kw.get("id2label") is not None and kw.get("num_labels", len(kw["id2label"])) != len(kw["id2label"]):
            kw.pop("num_labels")
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        d = super().to_hf_dict()
        for key in ("type_vocab_size", "position_embedding_type", "classifier_dropout"):
            d.pop(key)
        d["model_type"] = MODEL_TYPE
        return d


def relative_position_bucket(relative: torch.Tensor) -> torch.Tensor:
    """T5's bidirectional buckets as transformers' MPNet computes them: half the buckets per direction (keys after
    the query in the upper half), exact below 8 tokens, logarithmic up to MAX_DISTANCE, the last bucket beyond."""
    half = NUM_BUCKETS // 2
    exact = half // 2
    n = -relative
    side = (n < 0).to(torch.long) * half
    n = n.abs()
    far = exact + (torch.log(n.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).to(torch.long)
    far = torch.min(far, torch.full_like(far, half - 1))
    return side + torch.where(n < exact, n, far)


class MPNetEmbeddings(nn.Module):
    """word + position (RoBERTa's positions past the padding index) -> LayerNorm -> dropout."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PADDING_IDX)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                padding_idx=PADDING_IDX)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # From the ids, not the attention mask, as transformers does.
        real = input_ids.ne(PADDING_IDX).long()
        positions = torch.cumsum(real, dim=1) * real + PADDING_IDX
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class MPNetSelfAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + position bias + mask) v -> o."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q = nn.Linear(config.hidden_size, config.hidden_size)
        self.k = nn.Linear(config.hidden_size, config.hidden_size)
        self.v = nn.Linear(config.hidden_size, config.hidden_size)
        self.o = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(hidden)), self._split(self.k(hidden)), self._split(self.v(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias + additive_mask
        probs = self.dropout(torch.softmax(scores, dim=-1))
        out = torch.matmul(probs, v).transpose(1, 2)
        return self.o(out.reshape(hidden.shape))


class MPNetAttention(nn.Module):
    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.attn(hidden, bias, additive_mask)) + hidden)


class MPNetLayer(nn.Module):
    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: torch.Tensor, bias: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention(hidden, bias, additive_mask)
        return self.output(self.intermediate(attended), attended)


class MPNetEncoder(nn.Module):
    """The layers and the one relative-position bias table they all add."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets,
                                                    config.num_attention_heads)
        # bucket of distance d = key - query at index d + (longest - 1); not in the state dict.
        longest = config.max_position_embeddings
        self.register_buffer("buckets", relative_position_bucket(torch.arange(1 - longest, longest)),
                             persistent=False)

    def position_bias(self, seq: int) -> torch.Tensor:
        """[1, heads, S, S]: the bias of key j for query i."""
        pos = torch.arange(seq, device=self.buckets.device)
        buckets = self.buckets[pos[None, :] - pos[:, None] + (self.buckets.shape[0] // 2)]
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        bias = self.position_bias(hidden.shape[1])
        for layer in self.layer:
            hidden = layer(hidden, bias, additive_mask)
        return hidden


class MPNetModel(nn.Module):
    """Embeddings + encoder -> last hidden state. transformers' MPNetModel also has a tanh pooler that no head and
    no sentence-transformers model reads; a base checkpoint's pooler weights are dropped on load."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetEncoder(config)
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> last_hidden_state [B, S, hidden]. token_type_ids is accepted and ignored (there are none)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.embeddings(input_ids)
        dtype = hidden.dtype
        additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return self.encoder(hidden, additive)

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """What every family's encoder answers (training/heads.py): no pooled vector."""
        return self(input_ids, attention_mask), None


class MPNetForMaskedLM(MaskedLM):
    prefix = "mpnet"
    decoder_path = "lm_head.decoder"
    bias_path = "lm_head.bias"

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__(config, MPNetModel(config))
        self.lm_head = RobertaLMHead(config)
        self._init_head(self.lm_head)

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class MPNetForSequenceClassification(ProjectedClassifier):
    """On the <s> vector: dropout -> dense -> tanh -> dropout -> out_proj."""

    prefix = "mpnet"

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__(config, MPNetModel(config), torch.tanh)


class MPNetForTokenClassification(TokenClassifier):
    """dropout + a linear classifier at every position."""

    prefix = "mpnet"

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__(config, MPNetModel(config), config.hidden_dropout_prob)


# training/families.py's registries take these blocks as they are (kind -> (class, HF architecture, model_type)).
KINDS = {
    "mpnet-mlm": (MPNetForMaskedLM, "MPNetForMaskedLM", MODEL_TYPE),
    "mpnet-classifier": (MPNetForSequenceClassification, "MPNetForSequenceClassification", MODEL_TYPE),
    "mpnet-token-classifier": (MPNetForTokenClassification, "MPNetForTokenClassification", MODEL_TYPE),
}
# A base MPNetModel checkpoint (what sentence-transformers saves) loads as the MLM model's encoder.
ARCH_ALIASES = {"MPNetModel": "mpnet-mlm"}
TIED = {"mpnet-mlm": ("lm_head.decoder.weight", "lm_head.decoder.bias")}
HEADS = ("lm_head.", "classifier.", "mpnet.pooler.", "pooler.")
