"""``dtq-gateway``: run one gateway replica.

Settings come from ``DTQ_*`` environment variables and flags (``--help``). With no
DTQ_REDIS_URL an embedded redis-server is started, which the first log line says.
Exit status: 0 after a clean SIGTERM/SIGINT drain, 2 on bad settings, 1 on errors.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from dtq_gateway import logconf
from dtq_gateway.settings import SettingsError, load
from dtq_gateway.store.redis_policy import EvictionPolicyError

log = logging.getLogger("dtq_gateway")


async def _serve(settings, redis_url: str) -> None:
    from dtq_gateway.server import Gateway

    gateway = Gateway(settings, redis_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    await stop.wait()
    log.info("shutting down", extra={"grace_s": settings.shutdown_grace_s})
    await gateway.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dtq-gateway`` console script."""
    try:
        settings = load(sys.argv[1:] if argv is None else argv)
    except SettingsError as exc:
        print(f"dtq-gateway: {exc}", file=sys.stderr)
        return 2
    logconf.configure(settings.log_level, settings.log_format)
    embedded = None
    redis_url = settings.redis_url
    if not redis_url:
        from dtq_gateway.store.embedded import EmbeddedRedis, EmbeddedRedisError

        try:
            embedded = EmbeddedRedis(settings.embedded_dir)
            log.info("no DTQ_REDIS_URL: starting embedded redis-server with AOF",
                     extra={"binary": embedded.binary, "dir": str(embedded.dir),
                            "url": embedded.url})
            embedded.start()
        except (EmbeddedRedisError, OSError) as exc:
            log.error("embedded redis failed: %s", exc)
            return 1
        redis_url = embedded.url
    else:
        log.info("using redis from DTQ_REDIS_URL", extra={"settings": repr(settings)})
    try:
        import uvloop  # type: ignore[import-not-found]

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_serve(settings, redis_url))
    except OSError as exc:
        log.error("gateway failed: %s (gRPC %s, metrics port %s)", exc, settings.listen,
                  settings.metrics_port or "off")
        return 1
    except EvictionPolicyError as exc:
        log.error("gateway refused to start: %s", exc)
        return 1
    finally:
        if embedded:
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
