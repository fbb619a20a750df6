"""The model repository and each version's lifecycle: from a package on disk to a served model and back.

    registry.py     ModelRepository: `<root>/<name>/<version>/`, routing (0 = latest SERVING), polling, swaps
    version.py      ModelVersion: LOADING -> SERVING / NOT_SERVING (reason) -> UNLOADED, in-flight count, drain
    loading.py      build_model: a verified package -> an encoder or generation model (in a worker thread)
    package.py      reading and verifying one package: manifest, parity report, every listed file's sha256
    served_files.py the files the server opens for a variant (each must be listed) and the variants that passed
    external_data.py  the external data files a graph names (onnxruntime opens them beside it)
    consistency.py  load-time checks that the tokenizer, model.json and the graph belong together
    signature.py    a graph's tensor signature from the manifest; caller tensors checked against it

May import: server.runtime, server.protocol, server.text, server.sessions, server.model, the served models'
builders (server.encoders, server.generation). Never: the doors.
"""
