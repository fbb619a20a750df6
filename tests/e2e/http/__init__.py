"""The HTTP door: the OpenAI API, plain HTTP, the encoder tasks' routes, Ray Serve's HTTP ingress."""
