"""`--max-length`: the package's context, capped below the model's positions.

A decoder's cache slot is [kv_heads, max_length, head_dim] per layer and kind, sized by the package's max_length: a
model trained for long contexts (tens of thousands of positions) would otherwise cost the server that many
positions of cache per slot whether or not requests ever use them. The cap sets model.json max_length, the in-place
graph's rotary / position tables and the cache length the gate drives (docs/model-package.md)."""
from __future__ import annotations

from .errors import ExportError

# The gate's checks need this much room (a 20-token prompt in chunks, the mixed check's 24-token prompt beside
# rows of up to 10 tokens); encoder-decoders take the same floor (export/seq2seq_builder.py MIN_LENGTH).
MIN_LENGTH = 16
POSITION_KEYS = ("n_positions", "max_position_embeddings")


def position_key(config: dict) -> str:
    """The config.json key the model's positions are read from (for messages)."""
    return next((k for k in POSITION_KEYS if k in config), "max_position_embeddings")


def capped_length(wanted: int | None, positions: int, key: str = "max_position_embeddings",
                  flag: str = "--max-length") -> int:
    """The context a package is exported with: `wanted` (the flag), refused by name when it is past the model's
    `positions` (config.json `key`) or below MIN_LENGTH; None keeps the model's positions."""
    if wanted is None:
        return positions
    if wanted > positions:
        raise ExportError(f"{flag}: {wanted} is past the model's {positions} positions (config.json {key})")
    if wanted < MIN_LENGTH:
        raise ExportError(f"{flag}: {wanted} tokens is below the {MIN_LENGTH} a package takes (the parity gate's "
                          "sequences need that room)")
    return wanted
