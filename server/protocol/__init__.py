"""What both front doors share about the wire, below any transport.

    errors.py    ServingError(code, message): the data plane's one error type, the message starting with the field
    types.py     the data plane's typed results (the doors turn them into protobuf or JSON)
    pairs.py     text pairs to score (rerank / score) and their results
    zero_shot.py a zero-shot classification request (checked: labels, the hypothesis template) and its result
    codecs.py    KServe v2 tensors <-> numpy
    jsontext.py  JSON text from clients, bounded before parsing, refusals naming the field
    kserve.py    KServe v2 semantics shared by gRPC and REST: the version-string rule, the extensions, ModelInfer's
                 text mode (a request decoded into a task call's arguments, the answer encoded; the data plane
                 makes the call, on the version it leased)
    protowire.py the protobuf wire format's varint (gRPC's undecodable-request walk, a graph's external data)

errors, types, pairs, codecs, jsontext and protowire import nothing outside server.protocol (zero_shot.py: its
result type from protos.results); kserve.py also takes GenerationParams (server.generation), the pipeline's entity
form (server.encoders.token_aggregation) and the activation names (server.encoders.activation), and never the data
plane (which calls it).
"""
