"""A variant checked where it serves: the package's probe (export/probes.py) run through the variant's session, its
answer compared with the one the variant gave on the exporting CPU (docs/model-package.md, "Probe").

A variant that answers otherwise here is treated as refused (server/repository/loading.py falls back to the next
variant and says why in the version's reason); packages without a probe are not checked. An encoder-decoder's probe
runs through the variant's decoder session and an encoder session of the variant opened for it (`open_graph`): the
source batch through the encoder, then the decoder's first call and one step on that encoder's own cross keys/values,
as export/probes.py recorded them; the encoder's output and the logits are each held to the tolerance.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from server.repository.package import Package, PackageError

log = logging.getLogger(__name__)

_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
               "tensor(uint8)": np.uint8, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def probe_file(package: Package) -> str | None:
    """The probe's file name when parity.json has a probe block (then it is one of the files the server opens)."""
    block: Any = package.parity.get("probe")
    return block.get("file") if isinstance(block, dict) and isinstance(block.get("file"), str) else None


def probe_mismatch(package: Package, variant: str, session: ort.InferenceSession,
                   open_graph: Callable[[str], ort.InferenceSession] | None = None) -> str | None:
    """Why `variant` does not compute here what it computed at export; None when it does or has no probe.
    `open_graph(file)` opens another graph of the variant (an encoder-decoder's encoder) as the server would."""
    block: Any = package.parity.get("probe")
    name = probe_file(package)
    if name is None or variant not in (block.get("variants") or ()):
        return None
    try:
        with np.load(package.file(name), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise PackageError(f"{name}: not a probe file ({exc})") from None
    spec = package.manifest.encoder_decoder
    kinds = ("encoder", "answer") if spec is not None else ("answer",)
    wanted = [arrays.get(f"{kind}.{variant}") for kind in kinds]
    if any(w is None for w in wanted) or (spec is not None and "target.input_ids" not in arrays):
        raise PackageError(f"{name}: no {' and '.join(kinds)} of {variant} although parity.json's probe lists it")
    if spec is not None:
        if open_graph is None:
            raise ValueError("an encoder-decoder's probe needs open_graph for its encoder")
        got = seq2seq_answers(open_graph(spec.encoder_file(variant)), session, arrays, spec.max_target_length)
    else:
        feeds = {k.removeprefix("feed."): v for k, v in arrays.items() if k.startswith("feed.")}
        got = session.run([session.get_outputs()[0].name], {**feeds, **_zero_cache(session, feeds, package)})[:1]
    tolerance = float(block.get("tolerance", 0.0))
    for kind, want, have in zip(kinds, wanted, got):
        worst = float(np.abs(have.astype(np.float64) - want).max()) if have.shape == want.shape else float("inf")
        bound = tolerance * max(1.0, float(np.abs(want).max()))
        if worst > bound:
            what = {"encoder": "its encoder's output", "answer": "its answer"}[kind]
            return (f"its probe answers differently on this CPU ({what}: largest difference {worst:.3g}, bound "
                    f"{bound:.3g}): its gate's verdict does not hold here")
        log.debug("%s variant %s: probe %s within %.3g (bound %.3g)", package.name, variant, kind, worst, bound)
    return None


def seq2seq_answers(encoder: ort.InferenceSession, decoder: ort.InferenceSession, probe: dict[str, np.ndarray],
                    max_target: int) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's first output (zero beyond each row's source) and the decoder's logits: a first call of all
    the target's ids but the last on a zeroed self cache, then a step of the last reading what the first wrote."""
    source = {"input_ids": probe["feed.input_ids"], "attention_mask": probe["feed.attention_mask"]}
    cross_names = [o.name for o in encoder.get_outputs()]
    cross = dict(zip(cross_names, encoder.run(cross_names, source)))
    batch, target = source["input_ids"].shape[0], probe["target.input_ids"]
    cache = {}
    for graph_input in decoder.get_inputs():       # the self cache: past_key_values.* in, present.* out
        if graph_input.name.startswith("past_key_values."):
            dims = [d if isinstance(d, int) else max_target for d in graph_input.shape[1:]]
            cache[graph_input.name] = np.zeros([batch, *dims], _ONNX_TYPES[graph_input.type])
    names = [o.name for o in decoder.get_outputs()]
    steps, written = [], 0
    for width in (target.shape[1] - 1, 1):
        new = target[:, written:written + width]
        written += width
        out = dict(zip(names, decoder.run(names, {
            **cross, **cache, "input_ids": new, "attention_mask": np.ones((batch, written), np.int64),
            "encoder_attention_mask": source["attention_mask"]})))
        steps.append(out["logits"])
        cache = {k: out["present." + k.removeprefix("past_key_values.")] for k in cache}
    masked = cross[cross_names[0]] * source["attention_mask"][:, None, :, None]
    return masked, np.concatenate(steps, axis=1)


def _zero_cache(session: ort.InferenceSession, feeds: dict[str, np.ndarray], package: Package
                ) -> dict[str, np.ndarray]:
    # A decoder's past buffers: zeros of one row and the package's max length (a first prompt reads none of them).
    zeros = {}
    for graph_input in session.get_inputs():
        if graph_input.name in feeds:
            continue
        dims = [d if isinstance(d, int) else package.manifest.max_length for d in graph_input.shape]
        zeros[graph_input.name] = np.zeros([1, *dims[1:]], _ONNX_TYPES[graph_input.type])
    return zeros
