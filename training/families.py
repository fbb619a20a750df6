"""The families training/ knows, in one table each: which class a checkpoint kind builds, its HF architecture and
model_type, its config dataclass, and the checkpoint-key rules training/checkpoint.py applies (prefixes, tied keys,
heads, aliases). A new family registers here."""
from __future__ import annotations

import re

from torch import nn

from training import bart as bart_mod
from training import marian as marian_mod
from training import t5 as t5_mod
from training.albert import (AlbertConfig, AlbertForMaskedLM, AlbertForPreTraining, AlbertForSequenceClassification,
                             AlbertForTokenClassification)
from training.bert import (BertConfig, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,
                           BertForTokenClassification, BertModel)
from training.distilbert import (DistilBertConfig, DistilBertForMaskedLM, DistilBertForSequenceClassification,
                                 DistilBertForTokenClassification)
from training.electra import (ElectraConfig, ElectraForMaskedLM, ElectraForSequenceClassification,
                              ElectraForTokenClassification)
from training.gpt import GPT2LMHeadModel, GPTConfig
from training.gemma import FAMILIES as GEMMA_FAMILIES
from training.gemma import GemmaConfig, GemmaForCausalLM
from training.llama import FAMILIES as LLAMA_FAMILIES
from training.llama import LlamaConfig, LlamaForCausalLM
from training.roberta import (RobertaConfig, RobertaForMaskedLM, RobertaForSequenceClassification,
                              RobertaForTokenClassification)
from training.bart import BartConfig, BartForConditionalGeneration
from training.marian import MarianConfig, MarianMTModel
from training.t5 import T5Config, T5ForConditionalGeneration
from training import xlm_roberta as xlmr_mod
from training import modernbert as modernbert_mod
from training import deberta_v2_heads as deberta_mod
from training import m2m100 as m2m100_mod
from training import mbart as mbart_mod
from training import mpnet as mpnet_mod
from training.m2m100 import M2M100Config, M2M100ForConditionalGeneration
from training.mbart import MBartConfig, MBartForConditionalGeneration

# kind -> (model class, HF architecture name, model_type)
KINDS: dict[str, tuple[type[nn.Module], str, str]] = {
    "bert": (BertModel, "BertModel", "bert"),
    "bert-mlm": (BertForMaskedLM, "BertForMaskedLM", "bert"),
    "bert-pretraining": (BertForPreTraining, "BertForPreTraining", "bert"),
    "bert-classifier": (BertForSequenceClassification, "BertForSequenceClassification", "bert"),
    "gpt": (GPT2LMHeadModel, "GPT2LMHeadModel", "gpt2"),
    "roberta-mlm": (RobertaForMaskedLM, "RobertaForMaskedLM", "roberta"),
    "roberta-classifier": (RobertaForSequenceClassification, "RobertaForSequenceClassification", "roberta"),
    "albert-mlm": (AlbertForMaskedLM, "AlbertForMaskedLM", "albert"),
    "albert-pretraining": (AlbertForPreTraining, "AlbertForPreTraining", "albert"),
    "albert-classifier": (AlbertForSequenceClassification, "AlbertForSequenceClassification", "albert"),
    "distilbert-mlm": (DistilBertForMaskedLM, "DistilBertForMaskedLM", "distilbert"),
    "distilbert-classifier": (DistilBertForSequenceClassification, "DistilBertForSequenceClassification",
                              "distilbert"),
    "electra-mlm": (ElectraForMaskedLM, "ElectraForMaskedLM", "electra"),
    "electra-classifier": (ElectraForSequenceClassification, "ElectraForSequenceClassification", "electra"),
    # Per-token classifiers (HF *ForTokenClassification): one linear `classifier` at every position.
    "bert-token-classifier": (BertForTokenClassification, "BertForTokenClassification", "bert"),
    "roberta-token-classifier": (RobertaForTokenClassification, "RobertaForTokenClassification", "roberta"),
    "albert-token-classifier": (AlbertForTokenClassification, "AlbertForTokenClassification", "albert"),
    "distilbert-token-classifier": (DistilBertForTokenClassification, "DistilBertForTokenClassification",
                                    "distilbert"),
    "electra-token-classifier": (ElectraForTokenClassification, "ElectraForTokenClassification", "electra"),
    # One class for the three Llama-family checkpoints; the architecture written follows config.model_type.
    "llama": (LlamaForCausalLM, "LlamaForCausalLM", "llama"),
    # Encoder-decoders (training/seq2seq.py's call convention).
    "marian": (MarianMTModel, "MarianMTModel", "marian"),
    "bart": (BartForConditionalGeneration, "BartForConditionalGeneration", "bart"),
    "t5": (T5ForConditionalGeneration, "T5ForConditionalGeneration", "t5"),
    **xlmr_mod.KINDS,
    **modernbert_mod.KINDS,   # modernbert-mlm, -classifier, -token-classifier
    **mpnet_mod.KINDS,        # mpnet-mlm, -classifier, -token-classifier
    # DeBERTa-v2 / v3 (training/deberta_v2_heads.py); its masked LM's head layout follows config `legacy`.
    "deberta-v2-mlm": (deberta_mod.DebertaV2ForMaskedLM, "DebertaV2ForMaskedLM", "deberta-v2"),
    "deberta-v2-classifier": (deberta_mod.DebertaV2ForSequenceClassification, "DebertaV2ForSequenceClassification",
                              "deberta-v2"),
    "deberta-v2-token-classifier": (deberta_mod.DebertaV2ForTokenClassification, "DebertaV2ForTokenClassification",
                                    "deberta-v2"),
    # Gemma 2 and Gemma 3 text: one class; the architecture written follows config.model_type.
    "gemma": (GemmaForCausalLM, "Gemma3ForCausalLM", "gemma3_text"),
    # Translation families (pre-norm): M2M100 / NLLB-200 and mBART.
    "m2m100": (M2M100ForConditionalGeneration, "M2M100ForConditionalGeneration", "m2m_100"),
    "mbart": (MBartForConditionalGeneration, "MBartForConditionalGeneration", "mbart"),
}
# Seq2seq kinds -> their module's checkpoint-key rules (tied_keys, normalise_hf_keys, head_source_key).
SEQ2SEQ = {"marian": marian_mod, "bart": bart_mod, "t5": t5_mod, "m2m100": m2m100_mod, "mbart": mbart_mod}
# model_type -> the config dataclass and the prefix HF puts the encoder/decoder under in headed models.
FAMILY_CONFIG: dict[str, type] = {"bert": BertConfig, "gpt2": GPTConfig, "roberta": RobertaConfig,
                                  "albert": AlbertConfig, "distilbert": DistilBertConfig,
                                  "electra": ElectraConfig, "marian": MarianConfig, "bart": BartConfig,
                                  "t5": T5Config,
                                  "m2m_100": M2M100Config, "mbart": MBartConfig,
                                  **{t: LlamaConfig for t in LLAMA_FAMILIES},
                                  "deberta-v2": deberta_mod.DebertaV2Config}
FAMILY_CONFIG["modernbert"] = modernbert_mod.ModernBertConfig
FAMILY_CONFIG.update({t: GemmaConfig for t in GEMMA_FAMILIES})
PREFIX = {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "distilbert": "distilbert.",
           "electra": "electra.", "deberta-v2": "deberta.", "modernbert": "model."}
ARCH_TO_KIND = {arch: kind for kind, (_, arch, _) in KINDS.items()}
# Architectures whose weights are an encoder / decoder we can start from (heads get fresh init).
ARCH_ALIASES = {"GPT2Model": "gpt", "GPT2LMHeadModel": "gpt", "RobertaModel": "roberta-mlm",
                 "AlbertModel": "albert-mlm", "DistilBertModel": "distilbert-mlm",
                 # ELECTRA's released discriminators: the encoder is kept, the replaced-token head dropped.
                 "ElectraModel": "electra-mlm", "ElectraForPreTraining": "electra-mlm",
                 "Qwen2ForCausalLM": "llama", "MistralForCausalLM": "llama", "LlamaModel": "llama",
                 # Base seq2seq checkpoints (bart-base is one): a tied head needs nothing more.
                 "MarianModel": "marian", "BartModel": "bart", "T5Model": "t5",
                 "DebertaV2Model": "deberta-v2-mlm", "M2M100Model": "m2m100", "MBartModel": "mbart",
                 "ModernBertModel": "modernbert-mlm"}   # gte-/nomic-modernbert: the encoder; a fresh MLM head
# Llama family, issue 39: Qwen3, SmolLM3, Phi-3 (training/llama.py).
ARCH_ALIASES.update({"Qwen3ForCausalLM": "llama", "SmolLM3ForCausalLM": "llama", "Phi3ForCausalLM": "llama"})
# kinds whose model_type may be any of several (Llama family).
KIND_TYPES = {"llama": tuple(LLAMA_FAMILIES)}
KIND_TYPES["gemma"] = tuple(GEMMA_FAMILIES)
ARCH_ALIASES["Gemma2ForCausalLM"] = "gemma"
# Decoder kinds with one class for several model_types (architecture by config, `model.` prefix, tied lm_head).
DECODER_KINDS = ("llama", "gemma")

# nn.Linear inside, Conv1D ([in, out]) in HF's GPT-2 files.
CONV1D = re.compile(r"^transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
# Keys HF derives from others (tied): never written, filled in on load.
TIED = {
    "bert-mlm": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
    "bert-pretraining": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
    "gpt": ("lm_head.weight",),
    "roberta-mlm": ("lm_head.decoder.weight", "lm_head.decoder.bias"),
    "albert-mlm": ("predictions.decoder.weight", "predictions.decoder.bias"),
    "albert-pretraining": ("predictions.decoder.weight", "predictions.decoder.bias"),
    "distilbert-mlm": ("vocab_projector.weight",),
    "electra-mlm": ("generator_lm_head.weight",),  # its bias is its own
    **xlmr_mod.TIED,
    "deberta-v2-mlm": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),  # legacy head only
}
# Head weights per family: may be missing from a source (fresh init) or dropped when the target lacks them.
HEADS = {
    "bert": ("cls.", "classifier.", "bert.pooler.", "pooler."),
    "roberta": ("lm_head.", "classifier.", "roberta.pooler.", "pooler."),
    "albert": ("predictions.", "sop_classifier.", "classifier.", "albert.pooler.", "pooler."),
    "distilbert": ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.", "classifier."),
    "electra": ("generator_predictions.", "generator_lm_head.", "discriminator_predictions.", "classifier."),
    "modernbert": ("head.", "decoder.", "classifier."),
    "deberta-v2": ("cls.", "lm_predictions.", "pooler.", "classifier."),
}
# A family's own key rules, given the model (what transformers ignores on load; a head of the other layout).
KEY_RULES = {"deberta-v2": deberta_mod.normalise_hf_keys}
# Buffers old checkpoints carry that are not parameters.
BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids|attn\.bias|attn\.masked_bias|rotary_emb\.inv_freq)$")

DEFAULT_KIND = {"bert": "bert", "gpt2": "gpt", "roberta": "roberta-mlm", "albert": "albert-mlm",
                 "distilbert": "distilbert-mlm", "electra": "electra-mlm", **{t: "llama" for t in LLAMA_FAMILIES},
                 "marian": "marian", "bart": "bart", "t5": "t5", "deberta-v2": "deberta-v2-mlm",
                 "modernbert": "modernbert-mlm", "m2m_100": "m2m100", "mbart": "mbart"}
DEFAULT_KIND.update({t: "gemma" for t in GEMMA_FAMILIES})
# XLM-RoBERTa (training/xlm_roberta.py): RoBERTa's model and key rules under its own model_type.
FAMILY_CONFIG[xlmr_mod.MODEL_TYPE] = xlmr_mod.XLMRobertaConfig
PREFIX[xlmr_mod.MODEL_TYPE] = "roberta."
HEADS[xlmr_mod.MODEL_TYPE] = HEADS["roberta"]
ARCH_ALIASES.update(xlmr_mod.ARCH_ALIASES)
DEFAULT_KIND[xlmr_mod.MODEL_TYPE] = "xlm-roberta-mlm"
# MPNet (training/mpnet.py): its own encoder under `mpnet.`, RoBERTa's heads; its kinds are in KINDS above.
FAMILY_CONFIG[mpnet_mod.MODEL_TYPE] = mpnet_mod.MPNetConfig
PREFIX[mpnet_mod.MODEL_TYPE] = "mpnet."
HEADS[mpnet_mod.MODEL_TYPE] = mpnet_mod.HEADS
TIED.update(mpnet_mod.TIED)
ARCH_ALIASES.update(mpnet_mod.ARCH_ALIASES)
DEFAULT_KIND[mpnet_mod.MODEL_TYPE] = "mpnet-mlm"
