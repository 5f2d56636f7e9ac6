"""A descriptor pool for server reflection that also resolves method and enum-value symbols.

``grpcio-reflection`` answers ``file_containing_symbol`` with
``DescriptorPool.FindFileContainingSymbol``. With the upb protobuf runtime that call
finds services, messages, fields and enums, but not a service's methods
(``dtq.v1.Admin.ListQueues``) nor enum values, so ``grpcurl describe
dtq.v1.Admin.ListQueues`` answered "Symbol not found". :class:`ReflectionPool`
falls back to the enclosing symbol (the service or enum), whose file is the same.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pool


class ReflectionPool:
    """Delegates to a :class:`DescriptorPool`; symbol lookups fall back to the parent.

    Args:
        pool: the pool to read (default: the process's default pool, where the
            generated ``*_pb2`` modules register their files).
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool or descriptor_pool.Default()

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        """The file descriptor defining ``symbol`` (a full name, e.g. ``pkg.Svc.Method``).

        Raises:
            KeyError: neither the symbol nor its enclosing symbol is known.
        """
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            parent, dot, member = symbol.rpartition(".")
            if not dot or not parent:
                raise
            found = self._pool.FindFileContainingSymbol(parent)
            if not self._defines_member(parent, member):
                raise KeyError(f"Couldn't find symbol {symbol}") from None
            return found

    def _defines_member(self, parent: str, name: str) -> bool:
        """True when ``parent`` is a service with method ``name`` or an enum with value
        ``name`` (only then is the parent's file the answer)."""
        for find, members in ((self._pool.FindServiceByName, "methods_by_name"),
                              (self._pool.FindEnumTypeByName, "values_by_name")):
            try:
                return name in getattr(find(parent), members)
            except KeyError:
                continue
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
