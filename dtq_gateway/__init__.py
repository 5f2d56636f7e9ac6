"""dtq gateway: the only process that talks to Redis; serves dtq.v1 over gRPC."""

__version__ = "0.1.0"
