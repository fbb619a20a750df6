"""A minimal onnxruntime runtime for Seldon MLServer (runs inside bench/.venv-mlserver, not ours).

load: one InferenceSession on the model URI; predict: decode every input tensor, run the graph, encode
every output. Threads come from the model's `parameters.extra` so both servers use the same count.
"""
from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self.settings)
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(extra.get("intra_op_threads", 0))
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {inp.name: NumpyCodec.decode_input(inp) for inp in payload.inputs}
        results = self.session.run(self.output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, arr) for name, arr in zip(self.output_names, results)],
        )
