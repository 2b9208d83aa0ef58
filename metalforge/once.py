"""A dict whose values are built once per key, for the in-process caches that threads share
(traces, specialisations, schedules, libraries, compiled kernels, backward graphs, ...).

`OnceMap.get_or_build(key, build)` returns the value published for `key`, or runs `build()`
under that key's lock and publishes its result: threads asking for one key while it is being
built wait for the first build and get its value; different keys build in parallel. A value is
published once and never replaced (unless the entry is stale, see `get_or_build`), so anything
keyed on it stays valid. Reads of a published key take no lock. The locks are reentrant: a
build that asks for its own key again recurses as it would without them, instead of hanging.

It is a plain dict otherwise (reading, iterating, clearing and, in tests, setting entries).
Values are never None (None reads as "not built yet"). A build that raises publishes nothing:
the next caller of that key (one waiting, or a later one) builds again.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable, Optional, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class OnceMap(dict[K, V]):
    """Values by key, each built once (other threads wait for that build)."""

    def __init__(self) -> None:
        super().__init__()
        self._building: dict[K, threading.RLock] = {}     # key -> its lock, while building
        self._guard = threading.Lock()                    # guards `_building`

    def get_or_build(self, key: K, build: Callable[[], V],
                     current: Optional[Callable[[V], bool]] = None) -> V:
        """The value for `key`, built by `build()` if there is none; `current(value)` False
        says a published value is stale (its key was an object id that is now another
        object's) and is rebuilt, once, like a missing one."""
        got = self.get(key)
        if got is not None and (current is None or current(got)):
            return got
        lock = self._lock(key)
        with lock:
            got = self.get(key)
            if got is None or (current is not None and not current(got)):
                got = build()
                self[key] = got
        with self._guard:                   # built: later callers find the value, not the lock
            if self._building.get(key) is lock:
                del self._building[key]
        return got

    def _lock(self, key: K) -> threading.RLock:
        with self._guard:
            lock = self._building.get(key)
            if lock is None:
                lock = self._building[key] = threading.RLock()
            return lock
