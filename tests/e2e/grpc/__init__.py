"""The gRPC door: the task API, the client library and CLI, batch jobs, served engines."""
