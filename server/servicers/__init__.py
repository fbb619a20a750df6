"""gRPC servicers: thin adapters from protobuf to the data plane (server/dataplane.py)."""
