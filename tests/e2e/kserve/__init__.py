"""The KServe v2 door: REST with the real tritonclient.http, and the protocol's wire contract. (KServe over gRPC is
tested beside the task API on one server in e2e/grpc/test_server_rpcs.py.)"""
