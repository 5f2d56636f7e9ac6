"""dtq's Redis boundary: the one package that talks to Redis.

It holds the client for each deployment mode (:mod:`.client`: standalone, cluster,
Sentinel, and the helpers that differ between them), the key names (:mod:`.keys`), the
Lua scripts (``lua/``, loaded by :mod:`.scripts` and :mod:`.admin_scripts`), every Redis
command the gateway sends, and the mapping of Redis failures to domain errors
(:mod:`.errors`). The layers above (``rpc``, ``web``, ``leasing``, ``duties``, ``events``)
call its functions and never Redis; ``docs/design.md`` draws the layers.
"""
