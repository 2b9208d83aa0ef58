"""A bounded in-memory map, the explicit per-kernel caches of warm-call closures
(runtime/fastpath.py) and cuda call plans (cuda/library.py)."""
from __future__ import annotations

import threading
from typing import Generic, Hashable, Optional, TypeVar

V = TypeVar("V")


class Bounded(Generic[V]):
    """Values by key, at most `size` of them (the oldest goes first); a None key (a call
    that is not to be kept) is never stored. Reads take no lock; writes do, so that eviction
    sees a stable dict (entries are only added or dropped whole)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[Hashable, V] = {}
        self._lock = threading.Lock()
        self.find = self._entries.get        # `get` of a key known not to be None (faster)

    def get(self, key: Optional[Hashable]) -> Optional[V]:
        return None if key is None else self._entries.get(key)

    def put(self, key: Optional[Hashable], value: V) -> None:
        if key is None:
            return
        with self._lock:
            while len(self._entries) >= self.size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = value

    def __len__(self) -> int:
        return len(self._entries)
