"""ortserve server: gRPC (task API + KServe v2) on onnxruntime. Never imports torch."""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("ortserve")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
