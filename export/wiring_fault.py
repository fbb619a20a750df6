"""Test hook: break one connection of a built graph, so a test can prove the gate refuses a wiring fault (the kind
of mistake a hand-written graph can make) with an error far above the noise-scaled fp32 tolerance
(export/parity_noise.py). Used with the weight perturbation hook (export/model_builder.py PERTURB_ENV) when
FAULT_ENV is "wiring". Never set in production."""
from __future__ import annotations

import logging
from pathlib import Path

import onnx

log = logging.getLogger(__name__)

FAULT_ENV = "ORTSERVE_EXPORT_FAULT"
SKIP_NORMS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
NORMS = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization")


def drop_first_residual(path: Path) -> str:
    """The first residual connection in node order dropped: a fused skip-norm then adds its input to itself (the
    residual stream no longer reaches it); a norm fed by an Add of two computed tensors takes the Add's first
    input alone. Shapes stay valid, so the graph runs and only its values are wrong. Returns what was changed."""
    model = onnx.load(str(path))
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    producer = {out: n for n in graph.node for out in n.output}
    for node in graph.node:
        if node.op_type in SKIP_NORMS:
            change = f"{node.op_type} {node.name}: skip {node.input[1]} -> {node.input[0]}"
            node.input[1] = node.input[0]
            break
        add = producer.get(node.input[0]) if node.op_type in NORMS else None
        if add is not None and add.op_type == "Add" and not set(add.input) & constants:
            change = f"{node.op_type} {node.name}: input {node.input[0]} (Add of {', '.join(add.input)}) -> {add.input[0]}"
            node.input[0] = add.input[0]
            break
    else:
        raise ValueError(f"{path.name}: no residual connection found")
    onnx.save(model, str(path))
    log.warning("%s=wiring: %s in %s", FAULT_ENV, change, path.name)
    return change
