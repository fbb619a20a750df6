"""Graph input/output names of the package signatures (docs/model-package.md, "Graph signatures")."""
from __future__ import annotations

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DECODER_INPUTS = ("input_ids", "attention_mask", "position_ids")
KV_KINDS = ("key", "value")
# The in-place decoder's mixed graph: its second group of rows has every I/O name with this prefix.
MIXED_PREFIX = "chunk."
# Element types a decoder graph's cache inputs may have (onnxruntime's type string -> numpy dtype name);
# int8 is the kv8 variant's quantized cache.
CACHE_ELEMENT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int8)": "int8"}


def past_name(layer: int, kind: str) -> str:
    """The decoder's cache input of one layer: past_key_values.{layer}.{key|value}."""
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """The decoder's cache output of one layer: present.{layer}.{key|value}."""
    return f"present.{layer}.{kind}"


def cross_name(layer: int, kind: str) -> str:
    """An encoder-decoder's cross-attention keys/values of one decoder layer (encoder output, decoder input):
    cross.{layer}.{key|value}."""
    return f"cross.{layer}.{kind}"


def cross_names(num_layers: int) -> list[str]:
    """[cross.0.key, cross.0.value, cross.1.key, ...]."""
    return [cross_name(i, kind) for i in range(num_layers) for kind in KV_KINDS]


def past_names(num_layers: int) -> list[str]:
    """[past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ...]."""
    return [past_name(i, kind) for i in range(num_layers) for kind in KV_KINDS]


def present_names(num_layers: int) -> list[str]:
    """[present.0.key, present.0.value, present.1.key, ...] (same order as past_names)."""
    return [present_name(i, kind) for i in range(num_layers) for kind in KV_KINDS]
