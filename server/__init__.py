"""ortserve server: gRPC (task API, KServe v2) and HTTP (KServe v2 REST, OpenAI API) on onnxruntime. Never imports
torch. server/README.md maps its parts."""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("ortserve")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
