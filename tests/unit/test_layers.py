"""The gateway's layers (docs/design.md, "Layers and folders"), checked on the source.

- Only ``dtq_gateway/store/`` imports redis-py, loads the Lua scripts, or sends a Redis
  command: the layers above hand the client to store functions and never call it.
- Imports point down: ``rpc`` and ``web`` on top; ``leasing``, ``duties`` and ``events``
  below them (never importing ``rpc`` or ``web``); ``store`` below those, importing
  none of them; ``domain`` (pure rules: names, validation, plans) at the bottom,
  importing no layer at all, the store included. Top-level modules (settings, errors,
  metrics, ...) are shared by all and import no layer but the store; server.py, cli.py
  and settings.py wire them together.
- No import cycles among the modules of dtq_gateway, dtq_pyworker and dtq_cli, counting
  every import that runs (module level or inside a function; ``if TYPE_CHECKING:``
  blocks aside).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dtq_gateway"
LAYERS = ("rpc", "web", "leasing", "duties", "events", "store", "domain")
#: What each layer must not import.
FORBIDDEN = {
    "store": {"rpc", "web", "leasing", "duties", "events"},
    "leasing": {"rpc", "web"},
    "duties": {"rpc", "web"},
    "events": {"rpc", "web"},
    "": {"rpc", "web", "leasing", "duties", "events"},  # shared top-level modules
    # the pure rules (names and ids, new-task validation, schedule and follow-up plans):
    # a leaf below the store that every layer may import
    "domain": {"rpc", "web", "leasing", "duties", "events", "store"},
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
    ("domain", "from dtq_gateway.store import keys\n", "domain imports dtq_gateway.store.keys"),
])
def test_each_rule_catches_its_breach(tmp_path, monkeypatch, layer, source, says):
    fake = tmp_path / "dtq_gateway"
    (fake / layer).mkdir(parents=True, exist_ok=True)
    path = fake / layer / "m.py"
    path.write_text(source)
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert any(says in v for v in violations(path))


# --- No import cycles -------------------------------------------------------------------

ROOT = PACKAGE.parent
#: The packages whose modules must not import each other in a circle.
CYCLE_PACKAGES = ("dtq_gateway", "dtq_pyworker", "dtq_cli")
#: Cycles known and being removed on other branches (issue 22): each is listed as the
#: sorted tuple of its modules, and only that exact cycle is let through. None is left:
#: the dispatcher and its sessions, and the worker and its session loops, no longer
#: import each other.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def _module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` that runs: at module level, in a function,
    anywhere but the body of an ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [node]
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        return [i for child in node.orelse for i in _runtime_imports(child)]
    return [i for child in ast.iter_child_nodes(node) for i in _runtime_imports(child)]


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports (``from p import m`` names the
    module ``p.m`` when it is one, else ``p``)."""
    modules = _module_names(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
                continue
            base = node.module or ""
            if node.level:
                up = here[:len(here) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    deps.add(target)
                elif base in modules:
                    deps.add(base)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of ``graph`` with more than one module, each
    as a sorted tuple (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return sorted(found)


def test_no_import_cycles():
    found = [c for c in cycles(import_graph(ROOT, CYCLE_PACKAGES)) if c not in KNOWN_CYCLES]
    assert found == []


@pytest.mark.parametrize(("files", "cycle"), [
    ({"a.py": "from p import b\n", "b.py": "import p.a\n"}, ("p.a", "p.b")),
    ({"a.py": "def f():\n    from p.b import x\n", "b.py": "from p.a import y\n"},
     ("p.a", "p.b")),
    ({"a.py": "from . import b\n", "b.py": "from .c import z\n", "c.py": "from p import a\n"},
     ("p.a", "p.b", "p.c")),
    ({"__init__.py": "from p.a import x\n", "a.py": "from p import y\n"}, ("p", "p.a")),
])
def test_the_cycle_check_finds_a_cycle(tmp_path, files, cycle):
    (tmp_path / "p").mkdir()
    for name, text in {"__init__.py": "", **files}.items():
        (tmp_path / "p" / name).write_text(text)
    assert cycles(import_graph(tmp_path, ("p",))) == [cycle]


def test_the_cycle_check_skips_type_checking_imports(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("from p.b import x\n")
    (tmp_path / "p" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import y\n")
    assert cycles(import_graph(tmp_path, ("p",))) == []
