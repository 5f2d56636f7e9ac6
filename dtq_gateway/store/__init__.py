"""dtq's Redis boundary: the client for each deployment mode (standalone, cluster,
Sentinel) and everything that differs between them.

Today this package builds the client (:mod:`dtq_gateway.store.client`) and holds the
mode-specific helpers (SCAN over every primary, the per-node script cache); keys
(``dtq_gateway.keys``) and scripts (``dtq_gateway.scripts``) move here as the rest of the
gateway's Redis calls do.
"""
