"""Read a checkpoint directory (docs/checkpoint-format.md) and check it can serve the requested task."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpkg import sha256_file

from .errors import ExportError

log = logging.getLogger(__name__)

# Architecture -> the tasks its head serves, each with the training.checkpoint.load_model kind to build.
# (A *ForPreTraining checkpoint serves fill-mask through its MLM part.)
ARCHITECTURE_TASKS: dict[str, dict[str, str]] = {
    "BertForSequenceClassification": {"classify": "bert-classifier"},
    "BertForMaskedLM": {"fill-mask": "bert-mlm"},
    "BertForPreTraining": {"fill-mask": "bert-mlm"},
    "RobertaForSequenceClassification": {"classify": "roberta-classifier"},
    "RobertaForMaskedLM": {"fill-mask": "roberta-mlm"},
    "AlbertForSequenceClassification": {"classify": "albert-classifier"},
    "AlbertForMaskedLM": {"fill-mask": "albert-mlm"},
    "AlbertForPreTraining": {"fill-mask": "albert-mlm"},
    "DistilBertForSequenceClassification": {"classify": "distilbert-classifier"},
    "DistilBertForMaskedLM": {"fill-mask": "distilbert-mlm"},
    "ElectraForSequenceClassification": {"classify": "electra-classifier"},
    "ElectraForMaskedLM": {"fill-mask": "electra-mlm"},  # the generator; the discriminator has no served head
    # Per-token classifiers: logits [batch, sequence, labels].
    "BertForTokenClassification": {"token-classify": "bert-token-classifier"},
    "RobertaForTokenClassification": {"token-classify": "roberta-token-classifier"},
    "AlbertForTokenClassification": {"token-classify": "albert-token-classifier"},
    "DistilBertForTokenClassification": {"token-classify": "distilbert-token-classifier"},
    "ElectraForTokenClassification": {"token-classify": "electra-token-classifier"},
    "GPT2LMHeadModel": {"generate": "gpt"},
    # Llama family: exported as the in-place graph only (rotary and grouped-query attention live in the op).
    "LlamaForCausalLM": {"generate": "llama"},
    "Qwen2ForCausalLM": {"generate": "llama"},
    "MistralForCausalLM": {"generate": "llama"},
    # Encoder-decoders: encoder.onnx + decoder.onnx (export/seq2seq_builder.py).
    "MarianMTModel": {"generate": "marian"},
    "BartForConditionalGeneration": {"generate": "bart"},
    "T5ForConditionalGeneration": {"generate": "t5"},
    # XLM-RoBERTa (training/xlm_roberta.py): RoBERTa's graphs; a base model serves embed only.
    "XLMRobertaForSequenceClassification": {"classify": "xlm-roberta-classifier"},
    "XLMRobertaForMaskedLM": {"fill-mask": "xlm-roberta-mlm"},
    "XLMRobertaForTokenClassification": {"token-classify": "xlm-roberta-token-classifier"},
    "XLMRobertaModel": {},
    # ModernBERT (training/modernbert.py): no token types; its encoder alone serves embed (export/embed.py).
    "ModernBertForSequenceClassification": {"classify": "modernbert-classifier"},
    "ModernBertForMaskedLM": {"fill-mask": "modernbert-mlm"},
    "ModernBertForTokenClassification": {"token-classify": "modernbert-token-classifier"},
    "ModernBertModel": {},
    # DeBERTa-v2 / v3 (training/deberta_v2.py); DebertaV2Model serves embed only (export/embed.py).
    "DebertaV2ForSequenceClassification": {"classify": "deberta-v2-classifier"},
    "DebertaV2ForMaskedLM": {"fill-mask": "deberta-v2-mlm"},
    "DebertaV2ForTokenClassification": {"token-classify": "deberta-v2-token-classifier"},
    "DebertaV2Model": {},
    # More of the Llama family (issue 39): the same in-place graph, training/llama.py's model.
    "Qwen3ForCausalLM": {"generate": "llama"},
    "SmolLM3ForCausalLM": {"generate": "llama"},
    "Phi3ForCausalLM": {"generate": "llama"},
    # Gemma 2 / Gemma 3 text: the in-place graph (export/gemma_graph.py).
    "Gemma2ForCausalLM": {"generate": "gemma"},
    "Gemma3ForCausalLM": {"generate": "gemma"},
    # MPNet (training/mpnet.py): relative-position bias, no token types; MPNetModel (sentence-transformers'
    # all-mpnet-base-v2, multi-qa-mpnet-*) serves embed only (export/embed.py).
    "MPNetForSequenceClassification": {"classify": "mpnet-classifier"},
    "MPNetForMaskedLM": {"fill-mask": "mpnet-mlm"},
    "MPNetForTokenClassification": {"token-classify": "mpnet-token-classifier"},
    "MPNetModel": {},
    # Base models of the BERT families (sentence-transformers' all-distilroberta-v1, msmarco-distilbert-*,
    # multi-qa-distilbert-cos-v1...): embed only, through the family's encoder.
    "RobertaModel": {},
    "DistilBertModel": {},
    "AlbertModel": {},
    "ElectraModel": {},
    # Translation families (pre-norm blocks; a target language forced per request: docs/checkpoint-format.md).
    "M2M100ForConditionalGeneration": {"generate": "m2m100"},
    "MBartForConditionalGeneration": {"generate": "mbart"},
}
# Which architectures carry the head each task needs.
TASK_ARCHITECTURES = {task: tuple(a for a, tasks in ARCHITECTURE_TASKS.items() if task in tasks)
                      for task in ("classify", "fill-mask", "generate", "token-classify")}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_TASKS) + ("BertModel",)
# embed (export/embed.py): any encoder checkpoint, its own encoder and pooling; no head is used.
TASK_ARCHITECTURES["embed"] = tuple(a for a in SUPPORTED_ARCHITECTURES
                                    if "generate" not in ARCHITECTURE_TASKS.get(a, {}))
MODEL_TYPES = ("bert", "roberta", "albert", "distilbert", "electra", "gpt2", "llama", "qwen2", "mistral", "marian",
               "bart", "t5", "m2m_100", "mbart")
MODEL_TYPES += ("xlm-roberta",)
# Families with RoBERTa's positions (they start past the padding index).
ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "mpnet")
MODEL_TYPES += ("modernbert", "deberta-v2")
MODEL_TYPES += ("qwen3", "smollm3", "phi3")   # issue 39, the Llama family
MODEL_TYPES += ("gemma2", "gemma3_text")
MODEL_TYPES += ("mpnet",)
# Encoder families whose graph takes token_type_ids (ELECTRA's are BERT's). RoBERTa's tokenizer never sets them
# (the graph embeds type 0, as HF does without the argument) and DistilBERT has no token type embeddings at all.
TOKEN_TYPE_FAMILIES = ("bert", "albert", "electra")


@dataclass(frozen=True)
class CheckpointInfo:
    """What the export needs to know about a checkpoint before loading weights."""

    path: Path
    config: dict[str, Any]
    architecture: str
    model_type: str  # one of MODEL_TYPES
    weights_file: Path
    config_sha256: str
    weights_sha256: str

    @property
    def labels(self) -> list[str]:
        id2label = self.config.get("id2label") or {}
        return [str(id2label[k]) for k in sorted(id2label, key=int)]

    def _size(self, gpt2: str, distilbert: str, other: str) -> int:
        key = {"gpt2": gpt2, "distilbert": distilbert}.get(self.model_type, other)
        return int(self.config[key])

    @property
    def num_layers(self) -> int:
        return self._size("n_layer", "n_layers", "num_hidden_layers")

    @property
    def num_heads(self) -> int:
        return self._size("n_head", "n_heads", "num_attention_heads")

    @property
    def token_types(self) -> bool:
        """Whether the exported encoder graph takes token_type_ids (the manifest's inputs say so)."""
        if self.model_type == "deberta-v2":   # a table only when type_vocab_size > 0 (v2/v3 releases: none)
            return int(self.config.get("type_vocab_size") or 0) > 0
        return self.model_type in TOKEN_TYPE_FAMILIES

    def kind(self, task: str) -> str:
        """training.checkpoint.load_model kind that builds this checkpoint's head for `task`."""
        return ARCHITECTURE_TASKS[self.architecture][task]

    @property
    def num_kv_heads(self) -> int:
        """Heads of keys/values: fewer than num_heads under grouped-query attention."""
        return int(self.config.get("num_key_value_heads") or self.num_heads)

    @property
    def head_dim(self) -> int:
        """Llama-family configs may set head_dim apart from hidden_size / heads."""
        return int(self.config.get("head_dim") or self.hidden_size // self.num_heads)

    @property
    def hidden_size(self) -> int:
        return self._size("n_embd", "dim", "hidden_size")

    @property
    def max_positions(self) -> int:
        """Longest sequence the model takes (RoBERTa's positions start after the padding index)."""
        n = self._size("n_positions", "max_position_embeddings", "max_position_embeddings")
        if self.model_type in ROBERTA_POSITIONS:
            n -= int(self.config.get("pad_token_id", 1)) + 1
        return n


def optional_json(path: Path) -> dict:
    """A checkpoint's optional JSON file (tokenizer_config.json, sentence_bert_config.json): {} when absent."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"checkpoint: {path} is not valid JSON ({exc})") from None


def inspect_checkpoint(path: Path, task: str) -> CheckpointInfo:
    """Validate the directory, its config and the task; raise ExportError with one line otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"checkpoint: {path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ExportError(f"checkpoint: {cfg_file} is missing")
    try:
        config = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"checkpoint: {cfg_file} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ExportError(f"checkpoint: {cfg_file} is not a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise ExportError(f"checkpoint: config.json architectures must name exactly one architecture, got {archs!r}")
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ExportError(f"checkpoint: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    if arch not in TASK_ARCHITECTURES[task]:
        # Name the heads of the checkpoint's own family first (a BertModel needs a Bert*... head).
        family = str(config.get("model_type", "")).lower()
        same = [a for a in TASK_ARCHITECTURES[task] if family and a.lower().startswith(family)]
        need = " or ".join(same or TASK_ARCHITECTURES[task])
        raise ExportError(f"--task {task}: checkpoint architecture {arch} has no head for this task (needs {need})")
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ExportError(f"checkpoint: config.json model_type must be one of {', '.join(MODEL_TYPES)}, "
                          f"got {model_type!r}")
    weights = path / "model.safetensors"
    if not weights.is_file():
        weights = path / "pytorch_model.bin"
    if not weights.is_file():
        raise ExportError(f"checkpoint: {path} holds neither model.safetensors nor pytorch_model.bin")
    if not (path / "tokenizer.json").is_file():
        raise ExportError(f"checkpoint: {path / 'tokenizer.json'} is missing (the package must carry the tokenizer)")
    return CheckpointInfo(path=path.resolve(), config=config, architecture=arch, model_type=model_type,
                          weights_file=weights, config_sha256=sha256_file(cfg_file),
                          weights_sha256=sha256_file(weights))


def load_torch_model(info: CheckpointInfo, task: str):
    """Build the PyTorch model through the training stage's public API, in eval mode."""
    from training.checkpoint import CheckpointError, load_model

    try:
        model, _ = load_model(info.path, kind=info.kind(task))
    except CheckpointError as exc:
        raise ExportError(f"checkpoint: {exc}") from None
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        # safetensors / torch raise their own types on truncated or corrupt weight files.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"checkpoint: cannot load weights from {info.weights_file.name}: {first}") from None
    model.eval()
    return model
