"""The service version reported by ``/health`` and OpenAPI (the package version)."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("aoq-retrieval")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.1.0"
