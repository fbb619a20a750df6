"""The gRPC front door: protobuf <-> data-plane calls (server/dataplane.py), nothing below it.

    server.py    the grpc.aio server: services, reflection, the bearer-token interceptor, ports, TLS
    task.py      ortserve.v1.TaskService (protos/ortserve.proto)
    task_messages.py  Tokenize / Detokenize / Rerank / ZeroShotClassify messages <-> data-plane arguments and results
    inference_service.py  inference.GRPCInferenceService (KServe v2; text mode in server/protocol/kserve.py, shared with HTTP)
    health.py    grpc.health.v1
    common.py    what every servicer shares: deadlines, the unary / streaming handler wrappers
    status.py    THE data-plane error -> gRPC status mapping, the guard every method runs in (metrics)
    auth.py      bearer-token interceptor (health Check/Watch stay open)
    decoding.py  deserializers that cannot raise: undecodable bytes -> INVALID_ARGUMENT naming the field
    wire.py      which string field of a serialized message holds bad UTF-8 (for decoding.py)
"""
