"""What the parity gate is given (GateInputs), and the pieces every check shares: onnxruntime sessions, the
elementwise comparison, the gate's text as token ids and encoder feeds, PyTorch's encoder outputs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from .config import GridConfig, Tolerances
from .heldout import LabelledExample

Feeds = dict[str, np.ndarray]


@dataclass
class GateInputs:
    """Everything the gate needs besides the graphs."""

    model: torch.nn.Module
    task: str
    tokenizer: Tokenizer
    special_tokens: dict[str, int | None]
    max_length: int
    num_layers: int
    num_heads: int
    head_dim: int
    texts: list[str]
    labelled: list[LabelledExample] | None
    tolerances: Tolerances
    grid: GridConfig
    threads: int = 1
    num_kv_heads: int | None = None   # decoder: None = num_heads
    token_types: bool = True          # encoder: the graph takes token_type_ids (BERT, ALBERT; not RoBERTa/DistilBERT)


def session(path: Path, threads: int, providers: list[str] | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])


def diff(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> tuple[float, bool]:
    """(max |out - ref|, whether every element is within atol + rtol * |ref|)."""
    if out.shape != ref.shape:
        return float("inf"), False
    if not (np.isfinite(out).all() and np.isfinite(ref).all()):
        return float("nan"), False
    d = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    ok = bool((d <= atol + rtol * np.abs(ref)).all())
    return float(d.max()) if d.size else 0.0, ok


def pad_id(inp: GateInputs) -> int:
    for key in ("pad", "eos", "unk"):
        if inp.special_tokens.get(key) is not None:
            return int(inp.special_tokens[key])
    return 0


def token_stream(inp: GateInputs) -> np.ndarray:
    ids: list[int] = []
    for t in inp.texts:
        ids += inp.tokenizer.encode(t).ids
    return np.array(ids, dtype=np.int64)


def encode_batch(inp: GateInputs, texts: list[str], pairs: list[str | None] | None = None,
                 mask_every: int = 0) -> Feeds:
    """Right-padded encoder feeds; mask_every=k replaces every k-th non-special token with the mask id."""
    encs = [inp.tokenizer.encode(t, p) if p else inp.tokenizer.encode(t)
            for t, p in zip(texts, pairs or [None] * len(texts))]
    n = min(inp.max_length, max(len(e.ids) for e in encs))
    ids = np.full((len(encs), n), pad_id(inp), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for r, e in enumerate(encs):
        k = min(n, len(e.ids))
        ids[r, :k], mask[r, :k], types[r, :k] = e.ids[:k], 1, e.type_ids[:k]
        if mask_every:
            special = np.array(e.special_tokens_mask[:k], dtype=bool)
            candidates = np.flatnonzero(~special)
            ids[r, candidates[r % mask_every::mask_every]] = inp.special_tokens["mask"]
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if not inp.token_types:
        del feeds["token_type_ids"]
    return feeds


def torch_encoder(inp: GateInputs, feeds: Feeds) -> np.ndarray:
    with torch.no_grad():
        types = feeds.get("token_type_ids")
        out = inp.model(torch.from_numpy(feeds["input_ids"]), attention_mask=torch.from_numpy(feeds["attention_mask"]),
                        token_type_ids=None if types is None else torch.from_numpy(types))
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()
