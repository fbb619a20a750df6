"""The small typed pieces model.json is made of (shared by modelpkg/manifest.py and modelpkg/seq2seq.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# The protocols carry token counts and ids as int32 (ModelInfo.max_length, token ids): a manifest claiming more
# cannot be described to a client.
INT32_MAX = 2 ** 31 - 1


class ManifestError(ValueError):
    """model.json does not hold a usable manifest; the message names the field."""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive(where: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ManifestError(f"model.json: {where} must be a positive integer")
    return int(value)


@dataclass(frozen=True)
class TensorDecl:
    """One graph input or output: name, dtype name ("int64", "float32") and axes (ints or axis names)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any) -> "TensorDecl":
        if not (isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("dtype"), str)
                and isinstance(d.get("shape"), list)):
            raise ValueError("not a {name, dtype, shape} object")
        return cls(d["name"], d["dtype"], tuple(d["shape"]),
                   {k: v for k, v in d.items() if k not in ("name", "dtype", "shape")})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), **self.extra}


