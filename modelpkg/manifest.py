"""model.json as a typed, validated object that round-trips.

`Manifest.from_dict` checks what every reader relies on and raises ManifestError whose message starts with
`model.json: <field>`; `to_dict` gives the same JSON object back: fields it does not know (a newer exporter's)
are kept in `extra`, optional fields that were absent stay absent, and `cache` keeps unknown keys too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from .heads import head_channels
from .io_names import past_names, present_names
from .layout import FORMAT, TASKS
from .manifest_types import INT32_MAX, ManifestError, TensorDecl, is_int as _is_int, positive as _positive
from .seq2seq import Seq2SeqSpec

LAYOUT_CONCAT = "concat"     # present = concat(past, new): the cache grows by one position per step
LAYOUT_INPLACE = "inplace"   # present shares past's buffer [batch, kv_heads, max_length, head_dim]
CACHE_LAYOUTS = (LAYOUT_CONCAT, LAYOUT_INPLACE)

# Keys of model.json in the order the exporter writes them.
_KEYS = ("format", "name", "version", "task", "architecture", "labels", "max_length", "vocab_size",
         "special_tokens", "mask_token", "inputs", "outputs", "cache", "encoder_decoder", "variants",
         "default_variant", "opset", "source", "created_at")
# Written only when set (packages of the other families never carry it).
_OMITTED_WHEN_NONE = ("encoder_decoder",)
_CACHE_KEYS = ("num_layers", "num_heads", "head_dim", "layout", "num_kv_heads", "model_head_dim")


@dataclass(frozen=True)
class CacheSpec:
    """A decoder's KV cache: `layout` "concat" (default when absent) or "inplace"; `num_kv_heads` defaults to
    num_heads (multi-head attention; fewer for grouped-query attention). `head_dim` is the cache tensor's last
    axis; `model_head_dim` the model's own head size when the heads were zero-padded up to head_dim
    (modelpkg/heads.py says where its channels sit)."""

    num_layers: int
    num_heads: int
    head_dim: int
    layout: str = LAYOUT_CONCAT
    num_kv_heads: int | None = None   # None: absent from model.json (= num_heads)
    model_head_dim: int | None = None  # None: absent from model.json (= head_dim, no padding)
    extra: Mapping[str, Any] = field(default_factory=dict)
    has_layout: bool = False          # whether model.json wrote "layout" (so to_dict writes it back)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def real_head_dim(self) -> int:
        """The model's head size (smaller than head_dim when the heads were padded)."""
        return self.head_dim if self.model_head_dim is None else self.model_head_dim

    @property
    def channels(self) -> list[int]:
        """Where the model's head channels sit on the cache's last axis (all of them when not padded)."""
        return head_channels(self.real_head_dim, self.head_dim)

    @property
    def past_names(self) -> list[str]:
        return past_names(self.num_layers)

    @property
    def present_names(self) -> list[str]:
        return present_names(self.num_layers)

    def mixed_graph(self, variant: str) -> str | None:
        """The file of `variant`'s mixed twin (decode rows and a prompt chunk in one run), None when it has none:
        `mixed_graphs[variant]`; packages made before that key name only the fp32 twin, as `mixed_graph`."""
        graphs = self.extra.get("mixed_graphs")
        found = graphs.get(variant) if isinstance(graphs, dict) else \
            self.extra.get("mixed_graph") if variant == "fp32" else None
        return found if isinstance(found, str) else None

    @classmethod
    def from_dict(cls, d: Any) -> "CacheSpec":
        if not isinstance(d, dict):
            raise ManifestError("model.json: cache missing or not a dict")
        sizes = {k: _positive(f"cache.{k}", d.get(k)) for k in ("num_layers", "num_heads", "head_dim")}
        layout = d.get("layout", LAYOUT_CONCAT)
        if layout not in CACHE_LAYOUTS:
            raise ManifestError(f"model.json: cache.layout must be one of {', '.join(CACHE_LAYOUTS)}, got {layout!r}")
        kv_heads = d.get("num_kv_heads")
        if kv_heads is not None:
            kv_heads = _positive("cache.num_kv_heads", kv_heads)
            if sizes["num_heads"] % kv_heads:
                raise ManifestError(f"model.json: cache.num_kv_heads ({kv_heads}) must divide cache.num_heads "
                                    f"({sizes['num_heads']})")
        model_head_dim = d.get("model_head_dim")
        if model_head_dim is not None:
            model_head_dim = _positive("cache.model_head_dim", model_head_dim)
            if model_head_dim > sizes["head_dim"] or (model_head_dim < sizes["head_dim"] and sizes["head_dim"] % 2):
                raise ManifestError(f"model.json: cache.model_head_dim ({model_head_dim}) must not exceed "
                                    f"cache.head_dim ({sizes['head_dim']}), which is even when padded")
        return cls(**sizes, layout=layout, num_kv_heads=kv_heads, model_head_dim=model_head_dim,
                   extra={k: v for k, v in d.items() if k not in _CACHE_KEYS}, has_layout="layout" in d)

    def to_dict(self) -> dict[str, Any]:
        # The exporter's key order: sizes, then the layout, then what it does not type (mixed graphs).
        out: dict[str, Any] = {"num_layers": self.num_layers, "num_heads": self.num_heads, "head_dim": self.head_dim}
        if self.num_kv_heads is not None:
            out["num_kv_heads"] = self.num_kv_heads
        if self.model_head_dim is not None:
            out["model_head_dim"] = self.model_head_dim
        if self.has_layout or self.layout != LAYOUT_CONCAT:
            out["layout"] = self.layout
        return {**out, **self.extra}


def _check_seq2seq(task: str, cache: CacheSpec | None, spec: Seq2SeqSpec, variants: dict) -> None:
    """An encoder-decoder block agrees with the rest: a generate package with an in-place self cache of the same
    sizes, and a pair of graphs for every variant whose decoder is the variant's file."""
    if task != "generate" or cache is None:
        raise ManifestError("model.json: encoder_decoder is for task generate (with a cache block)")
    if cache.layout != LAYOUT_INPLACE:
        raise ManifestError("model.json: cache.layout must be inplace for an encoder_decoder package")
    for key in ("num_layers", "num_heads", "head_dim"):
        if getattr(cache, key) != getattr(spec, key):
            raise ManifestError(f"model.json: encoder_decoder.{key} ({getattr(spec, key)}) differs from cache.{key} "
                                f"({getattr(cache, key)})")
    if set(spec.graphs) != set(variants) or any(spec.decoder_file(v) != variants[v] for v in variants):
        raise ManifestError("model.json: encoder_decoder.graphs must name every variant, its decoder being the "
                            "variant's file")


@dataclass(frozen=True)
class Manifest:
    format: str
    task: str
    max_length: int
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    variants: Mapping[str, str]                       # variant name -> file name in the package
    name: str = ""
    version: int | None = None                        # None until published
    architecture: str = ""
    labels: tuple[str, ...] = ()                      # classify: index = logit column
    vocab_size: int | None = None
    special_tokens: Mapping[str, int | None] = field(default_factory=dict)
    mask_token: str | None = None                     # fill-mask only
    cache: CacheSpec | None = None                    # generate only
    encoder_decoder: Seq2SeqSpec | None = None        # generate by an encoder-decoder (modelpkg/seq2seq.py)
    default_variant: Mapping[str, str] | None = None  # device ("cpu", "cuda") -> variant
    opset: int | None = None
    source: Mapping[str, Any] = field(default_factory=dict)
    created_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version of the contract does not know
    absent: frozenset[str] = frozenset()              # optional keys model.json did not have

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"model.json: not JSON ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, m: Any) -> "Manifest":
        """Validates and types a manifest; ManifestError naming the first bad field."""
        if not isinstance(m, dict):
            raise ManifestError("model.json: is not a JSON object")

        def need(key: str, kind: type | tuple[type, ...]) -> Any:
            if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
                raise ManifestError(f"model.json: {key} missing or not a {getattr(kind, '__name__', kind)}")
            return m[key]

        def optional(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
            value = m.get(key)
            if value is None:
                return default
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ManifestError(f"model.json: {key} must be a {getattr(kind, '__name__', kind)} or null")
            return value

        if m.get("format") != FORMAT:
            raise ManifestError(f"model.json: format is {m.get('format')!r}, expected {FORMAT!r}")
        task = need("task", str)
        if task not in TASKS:
            raise ManifestError(f"model.json: task {task!r} is not one of {', '.join(TASKS)}")
        max_length = need("max_length", int)
        if not 1 <= max_length <= INT32_MAX:
            raise ManifestError(f"model.json: max_length must be in 1..{INT32_MAX} (an int32), got {max_length}")
        specs = {}
        for key in ("inputs", "outputs"):
            entries = need(key, list)
            try:
                specs[key] = tuple(TensorDecl.from_dict(e) for e in entries)
            except ValueError:
                specs[key] = ()
            if not specs[key]:
                raise ManifestError(f"model.json: {key} must be a non-empty list of {{name, dtype, shape}}")
        variants = need("variants", dict)
        if not variants or not all(isinstance(v, str) and v and "/" not in v and v != ".." for v in variants.values()):
            raise ManifestError("model.json: variants must map names to file names in the package")
        labels = optional("labels", list, [])
        if not all(isinstance(x, str) for x in labels):
            raise ManifestError("model.json: labels must be a list of strings")
        if task in ("classify", "token-classify") and not labels:
            raise ManifestError(f"model.json: labels must be a non-empty list of strings for {task}")
        mask_token = optional("mask_token", str, None)
        if task == "fill-mask" and mask_token is None:
            raise ManifestError("model.json: mask_token missing or not a str")
        cache = CacheSpec.from_dict(m.get("cache")) if task == "generate" else None
        seq2seq = None
        if m.get("encoder_decoder") is not None:
            seq2seq = Seq2SeqSpec.from_dict(m["encoder_decoder"])
            _check_seq2seq(task, cache, seq2seq, variants)
        special = optional("special_tokens", dict, {})
        if not all(v is None or _is_int(v) for v in special.values()):
            raise ManifestError("model.json: special_tokens must map names to token ids or null")
        version = optional("version", int, None)
        vocab_size = optional("vocab_size", int, None)
        if vocab_size is not None and not 1 <= vocab_size <= INT32_MAX:
            raise ManifestError(f"model.json: vocab_size must be in 1..{INT32_MAX} (an int32) or null, got {vocab_size}")
        return cls(format=FORMAT, task=task, max_length=max_length, inputs=specs["inputs"], outputs=specs["outputs"],
                   variants=dict(variants), name=optional("name", str, ""), version=version,
                   architecture=optional("architecture", str, ""), labels=tuple(labels),
                   vocab_size=vocab_size, special_tokens=dict(special),
                   mask_token=mask_token, cache=cache, encoder_decoder=seq2seq,
                   default_variant=optional("default_variant", dict, None),
                   opset=optional("opset", int, None), source=dict(optional("source", dict, {})),
                   created_at=optional("created_at", str, None),
                   extra={k: v for k, v in m.items() if k not in _KEYS},
                   absent=frozenset(k for k in _KEYS if k not in m))

    # ------------------------------------------------------------------ writing

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (known keys in the exporter's order, then unknown ones as they came)."""
        values: dict[str, Any] = {
            "format": self.format, "name": self.name, "version": self.version, "task": self.task,
            "architecture": self.architecture, "labels": list(self.labels), "max_length": self.max_length,
            "vocab_size": self.vocab_size, "special_tokens": dict(self.special_tokens), "mask_token": self.mask_token,
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "cache": None if self.cache is None else self.cache.to_dict(),
            "encoder_decoder": None if self.encoder_decoder is None else self.encoder_decoder.to_dict(),
            "variants": dict(self.variants),
            "default_variant": None if self.default_variant is None else dict(self.default_variant),
            "opset": self.opset, "source": dict(self.source), "created_at": self.created_at,
        }
        return {**{k: values[k] for k in _KEYS
                    if k not in self.absent and not (k in _OMITTED_WHEN_NONE and values[k] is None)}, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    # ------------------------------------------------------------------ what readers ask

    @property
    def matryoshka(self) -> bool:
        """An embedding package that declares Matryoshka shortening (model.json `embedding.matryoshka`)."""
        block = self.extra.get("embedding")
        return isinstance(block, dict) and block.get("matryoshka") is True

    @property
    def normalized_embeddings(self) -> bool:
        """An embedding package whose vectors are L2-normalised (model.json `embedding.normalize`)."""
        block = self.extra.get("embedding")
        return isinstance(block, dict) and bool(block.get("normalize"))

    def special_token(self, name: str) -> int | None:
        """A special token's id ("pad", "mask", "eos", ...); None when the tokenizer has none."""
        value = self.special_tokens.get(name)
        return value if _is_int(value) else None

    def variant_file(self, variant: str) -> str:
        return self.variants[variant]
