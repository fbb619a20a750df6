"""XLM-RoBERTa: RoBERTa's model under model_type "xlm-roberta" (Hugging Face's XLMRoberta* classes).

transformers' modeling_xlm_roberta is RoBERTa's module renamed: the same embeddings (positions past the padding
index), encoder, classification head (dense + tanh + out_proj on <s>), MLM head (`lm_head`) and token head, under
the same parameter names (`roberta.*` in headed models). What differs is the checkpoint's model_type and
architecture names, the configuration class's defaults (HF's: two token types, LayerNorm eps 1e-12, 512
positions; the released checkpoints write their own values) and the tokenizer: a SentencePiece Unigram model
with <s> <pad> </s> <unk> ... <mask> (XLMRobertaTokenizerFast), which the export's tokenizer checks take as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.roberta import (RobertaConfig, RobertaForMaskedLM, RobertaForSequenceClassification,
                              RobertaForTokenClassification)

MODEL_TYPE = "xlm-roberta"


# XLMRobertaConfig's class defaults where they differ from our RobertaConfig's: what transformers assumes for a key
# a config.json leaves out (save_pretrained writes every key; hand-written configs may not).
_HF_DEFAULTS = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12}


@dataclass
class XLMRobertaConfig(RobertaConfig):
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "XLMRobertaConfig":
        return super().from_hf_dict({**_HF_DEFAULTS, **d})

    def to_hf_dict(self) -> dict[str, Any]:
        d = super().to_hf_dict()
        d["model_type"] = MODEL_TYPE
        return d


class XLMRobertaForMaskedLM(RobertaForMaskedLM):
    pass


class XLMRobertaForSequenceClassification(RobertaForSequenceClassification):
    pass


class XLMRobertaForTokenClassification(RobertaForTokenClassification):
    pass


# training/checkpoint.py's registries take these blocks as they are (kind -> (class, HF architecture, model_type)).
KINDS = {
    "xlm-roberta-mlm": (XLMRobertaForMaskedLM, "XLMRobertaForMaskedLM", MODEL_TYPE),
    "xlm-roberta-classifier": (XLMRobertaForSequenceClassification, "XLMRobertaForSequenceClassification",
                               MODEL_TYPE),
    "xlm-roberta-token-classifier": (XLMRobertaForTokenClassification, "XLMRobertaForTokenClassification",
                                     MODEL_TYPE),
}
# A base XLMRobertaModel checkpoint (what sentence-transformers saves) loads as the MLM model's encoder.
ARCH_ALIASES = {"XLMRobertaModel": "xlm-roberta-mlm"}
TIED = {"xlm-roberta-mlm": ("lm_head.decoder.weight", "lm_head.decoder.bias")}
