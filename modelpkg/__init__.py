"""The model-package contract (docs/model-package.md), shared by export, server, pipeline and bench.

Torch-free and onnxruntime-free: only the standard library. One place for the format name, the name and
version rules of a repository, file hashing, the graph I/O names, and the typed manifest.
"""
from __future__ import annotations

from .building import BUILDING_FILE, Building, clear_building, read_building, write_building
from .hashing import file_hashes, sha256_file
from .heads import HEAD_MULTIPLE, head_channels, padded_head_dim
from .io_names import (CACHE_ELEMENT_TYPES, DECODER_INPUTS, ENCODER_INPUTS, KV_KINDS, MIXED_PREFIX, cross_name,
                       cross_names, past_name, past_names, present_name, present_names)
from .layout import (FORMAT, MANIFEST_FILE, NAME_PATTERN, PARITY_FILE, TASKS, TOKENIZER_FILE, existing_versions,
                     parse_version, valid_name)
from .seq2seq import DECODER_GRAPH, ENCODER_GRAPH, SEQ2SEQ_FAMILIES, Seq2SeqSpec
from .manifest import (CACHE_LAYOUTS, LAYOUT_CONCAT, LAYOUT_INPLACE, CacheSpec, Manifest, ManifestError,
                       TensorDecl)

__all__ = [
    "BUILDING_FILE", "Building", "clear_building", "read_building", "write_building",
    "CACHE_ELEMENT_TYPES", "CACHE_LAYOUTS", "CacheSpec", "DECODER_GRAPH", "DECODER_INPUTS", "ENCODER_GRAPH",
    "ENCODER_INPUTS", "FORMAT", "HEAD_MULTIPLE", "KV_KINDS", "LAYOUT_CONCAT", "LAYOUT_INPLACE", "MANIFEST_FILE",
    "MIXED_PREFIX", "Manifest", "ManifestError", "NAME_PATTERN", "PARITY_FILE", "SEQ2SEQ_FAMILIES", "Seq2SeqSpec",
    "TASKS", "TOKENIZER_FILE", "TensorDecl", "cross_name", "cross_names", "existing_versions", "file_hashes",
    "head_channels", "padded_head_dim", "parse_version", "past_name", "past_names", "present_name", "present_names",
    "sha256_file", "valid_name",
]
