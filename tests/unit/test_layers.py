"""The gateway's layers (docs/design.md, "Layers and folders"), checked on the source.

- Only ``dtq_gateway/store/`` imports redis-py, loads the Lua scripts, or sends a Redis
  command: the layers above hand the client to store functions and never call it.
- Imports point down: ``rpc`` and ``web`` on top; ``leasing``, ``duties`` and ``events``
  below them (never importing ``rpc`` or ``web``); ``store`` at the bottom, importing
  none of them. Top-level modules (settings, errors, validation, metrics, ...) are shared
  by all and import no layer but the store; server.py, cli.py and settings.py wire
  them together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dtq_gateway"
LAYERS = ("rpc", "web", "leasing", "duties", "events", "store")
#: What each layer must not import.
FORBIDDEN = {
    "store": {"rpc", "web", "leasing", "duties", "events"},
    "leasing": {"rpc", "web"},
    "duties": {"rpc", "web"},
    "events": {"rpc", "web"},
    "": {"rpc", "web", "leasing", "duties", "events"},  # shared top-level modules
}
#: Top-level modules that wire the layers together (they may import any): the gateway
#: process, its command line, and the settings loader, which checks DTQ_LEASE_SECRET and
#: DTQ_AUTH_TOKENS with their layers' parsers (imported when it runs).
WIRING = {"server.py", "cli.py", "__main__.py", "settings.py"}
#: Methods of redis-py clients, pipelines and pub/sub objects dtq uses or could.
_COMMAND_WORDS = """
    hget hset hmget hgetall hdel hincrby hsetnx hexists hlen hscan_iter hkeys xadd
    xreadgroup xread xack xdel xclaim xautoclaim xpending xpending_range xrange xrevrange
    xlen xinfo_stream xinfo_groups xinfo_consumers xgroup_create xgroup_delconsumer xtrim
    zadd zrem zrange zrangebyscore zrangebylex zrevrange zrevrangebyscore zcard zscore
    zcount zpopmin zscan_iter sadd srem smembers sismember smismember scard sscan_iter
    scan_iter scan delete unlink exists expire pexpire ttl pttl incr incrby decr mget
    mset setnx getdel publish pubsub subscribe psubscribe time info ping config_get
    config_set script_load evalsha eval execute_command pipeline transaction watch
    memory_usage dbsize flushall flushdb client_list cluster get_nodes get_primaries
"""
REDIS_COMMANDS = frozenset(_COMMAND_WORDS.split())
#: Names a Redis client, pipeline or pub/sub object goes by in dtq's code.
CLIENT_NAMES = frozenset({"redis", "_redis", "r", "pipe", "pipeline", "client", "conn",
                          "pubsub", "_pubsub"})
STORE_INTERNALS = {"dtq_gateway.store.scripts", "dtq_gateway.store.admin_scripts"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    """The layer of ``path``: a folder name, "" for a shared top-level module, "wiring"."""
    rel = path.relative_to(PACKAGE).parts
    if len(rel) == 1:
        return "wiring" if rel[0] in WIRING else ""
    return rel[0] if rel[0] in LAYERS else ""


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("dtq_gateway", "dtq_gateway.store"):  # modules by name
                out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
            else:
                out.append((node.lineno, node.module))
    return out


def _receiver(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def violations(path: Path) -> list[str]:
    """Every rule ``path`` breaks, as ``file:line: what``."""
    layer = _layer(path)
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent)
    found = []
    for line, name in _imports(tree):
        if layer != "store" and (name == "redis" or name.startswith("redis.")):
            found.append(f"{where}:{line}: imports {name} outside the store")
        if layer != "store" and name in STORE_INTERNALS:
            found.append(f"{where}:{line}: imports {name} (scripts stay in the store)")
        parts = name.split(".")
        if len(parts) > 1 and parts[0] == "dtq_gateway" and parts[1] in FORBIDDEN.get(layer, ()):
            found.append(f"{where}:{line}: {layer or 'top level'} imports {name} "
                         "(a layer above it)")
    if layer != "store":
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in REDIS_COMMANDS
                    and _receiver(node.func.value) in CLIENT_NAMES):
                found.append(f"{where}:{node.lineno}: Redis call "
                             f"{_receiver(node.func.value)}.{node.func.attr} outside the store")
    return sorted(set(found))


def test_the_layers_are_kept():
    found = [v for path in _modules() for v in violations(path)]
    assert found == []


@pytest.mark.parametrize(("layer", "source", "says"), [
    ("rpc", "import redis.asyncio\n", "imports redis.asyncio outside the store"),
    ("web", "async def f(redis):\n    await redis.hget('k', 'f')\n", "Redis call redis.hget"),
    ("duties", "from dtq_gateway.store.scripts import Script\n", "scripts stay in the store"),
    ("store", "from dtq_gateway.rpc import grpc_errors\n", "store imports dtq_gateway.rpc"),
    ("events", "from dtq_gateway.web.dashboard import Dashboard\n", "events imports"),
    ("", "from dtq_gateway.duties.duty import PeriodicDuty\n", "top level imports"),
])
def test_each_rule_catches_its_breach(tmp_path, monkeypatch, layer, source, says):
    fake = tmp_path / "dtq_gateway"
    (fake / layer).mkdir(parents=True, exist_ok=True)
    path = fake / layer / "m.py"
    path.write_text(source)
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert any(says in v for v in violations(path))
