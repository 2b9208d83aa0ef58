"""The on-disk cache folder and its entries: shared by every backend that caches build products.

What sits in the cache is mostly code that metalforge executes (compiled shared libraries, a
precompiled header), so a cache never makes a correct program fail or load something it did not
write itself:

- The folder is ``$METALFORGE_CACHE_DIR``, else ``~/.cache/metalforge``, made absolute when it
  is first used (a later ``os.chdir`` does not move it; compilers run in other folders) and
  created user-only (0700). If it cannot be created or written, belongs to another user, or
  there is no home folder to put it in (``HOME`` unset and no passwd entry), metalforge uses a
  private temporary folder for the rest of the process and says so once (`CacheWarning`); that
  folder is removed when the process exits.
- An entry is one file plus a record ``<file>.sum`` (its size and SHA-256), written after the
  file was built to a temporary name unique to the writer (process, thread, random suffix) and
  moved into place with ``os.replace``. Builders of one key take a per-key lock in the process
  (other threads wait for the first build) and an ``fcntl.flock`` on ``<file>.lock`` across
  processes.
- Before use an entry is checked: owned by this user, a regular file, size and hash as recorded.
  A bad entry (truncated, garbage, empty, record missing) is deleted and rebuilt, with one
  `CacheWarning`; it is never loaded.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "METALFORGE_CACHE_DIR"


class CacheWarning(UserWarning):
    """A cache folder or entry could not be used (metalforge worked around it)."""


def configured_root() -> Path | None:
    """The folder the user asked for: $METALFORGE_CACHE_DIR, else ~/.cache/metalforge, made
    absolute at its first use; None when neither is there (no $METALFORGE_CACHE_DIR, and no
    home folder: HOME unset and no passwd entry)."""
    text = os.environ.get(ENV)
    if not text:
        try:
            text = str(Path.home() / ".cache" / "metalforge")
        except RuntimeError:               # "Could not determine home directory."
            return None
    got = _absolute.get(text)
    if got is None:
        got = _absolute.setdefault(text, Path(os.path.abspath(text)))
    return got


_absolute: dict[str, Path] = {}                  # configured text -> its absolute folder
_roots: dict[Path | None, Path] = {}
_roots_lock = threading.Lock()
NO_HOME = ("cannot be placed: $METALFORGE_CACHE_DIR is unset and there is no home folder "
           "(HOME is unset and this user has no passwd entry)")


def _unusable(d: Path) -> str | None:
    """Why folder `d` cannot hold the cache (None when it can); creates it (0700) if missing."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError as e:
        return f"cannot be created ({e.strerror or e})"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    try:                                   # a real probe: os.access says yes to root anywhere
        fd, probe = tempfile.mkstemp(dir=d, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"is not writable ({e.strerror or e})"
    return None


def _private_folder() -> Path:
    """A new private temporary folder, removed when this process exits (not by a forked child,
    which inherits the exit hook but not the folder)."""
    d = Path(tempfile.mkdtemp(prefix="metalforge-cache-"))
    atexit.register(_remove, d, os.getpid())
    return d


def _remove(d: Path, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(d, ignore_errors=True)


def root() -> Path:
    """The usable cache folder (the configured one, else a private temporary one)."""
    want = configured_root()
    got = _roots.get(want)
    if got is not None:
        return got
    with _roots_lock:
        got = _roots.get(want)
        if got is None:
            why = NO_HOME if want is None else _unusable(want)
            if why is None and want is not None:
                got = want
            else:
                got = _private_folder()
                what = "the cache folder" if want is None else f"the cache folder {want}"
                warnings.warn(f"metalforge: {what} {why}; using the private temporary "
                              f"folder {got} for this process instead (set ${ENV} to a "
                              f"writable folder to keep compiled kernels between runs)",
                              CacheWarning, stacklevel=3)
            _roots[want] = got
    return got


def subdir(name: str) -> Path:
    """`root()/name`, created user-only."""
    d = root() / name
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def temp_name(target: Path) -> Path:
    """A temporary name next to `target`, unique to this process, thread and call."""
    return target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}."
                            f"{secrets.token_hex(4)}.tmp")


# --------------------------------------------------------------------------- locks

_key_locks: dict[str, threading.Lock] = {}
_key_locks_lock = threading.Lock()


def key_lock(key: str) -> threading.Lock:
    """One lock per key in this process (created on first use)."""
    with _key_locks_lock:
        lk = _key_locks.get(key)
        if lk is None:
            lk = _key_locks[key] = threading.Lock()
        return lk


@contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold `target`'s lock: the per-key thread lock, then a flock on `<target>.lock`."""
    with key_lock(str(target)):
        fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)                   # closing releases the flock


# --------------------------------------------------------------------------- entries

def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sum")


def _digest(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


_valid: dict[str, tuple[int, int, int]] = {}      # path -> (inode, size, mtime_ns) checked


def problem(path: Path) -> str | None:
    """Why the entry at `path` must not be used (None when it is good; "missing" if absent)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _valid.get(str(path)) == stamp:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid}), so metalforge will not load it"
    try:
        rec = _sum_path(path).read_text().split()
        size, digest = int(rec[0]), rec[1]
    except (OSError, ValueError, IndexError):
        return "has no valid size/hash record (an interrupted write?)"
    if st.st_size != size:
        return f"has {st.st_size} bytes where {size} were written (truncated or overwritten)"
    if _digest(path) != (size, digest):
        return "does not match the hash recorded when it was written (corrupt)"
    _valid[str(path)] = stamp
    return None


def _discard(path: Path, why: str) -> None:
    warnings.warn(f"metalforge: the cache entry {path} {why}; rebuilding it", CacheWarning,
                  stacklevel=4)
    for p in (path, _sum_path(path)):
        try:
            p.unlink()
        except OSError:
            pass


def _publish(tmp: Path, target: Path) -> None:
    """Record tmp's size and hash, then move it to `target` (record first: a reader that sees
    the new file with the old record re-checks under the lock)."""
    size, digest = _digest(tmp)
    rec = temp_name(_sum_path(target))
    rec.write_text(f"{size} {digest}\n")
    os.replace(rec, _sum_path(target))
    os.replace(tmp, target)
    st = os.stat(target)
    _valid[str(target)] = (st.st_ino, st.st_size, st.st_mtime_ns)


def entry(target: Path, build: Callable[[Path], None]) -> Path:
    """The checked entry at `target`, built with `build(tmp_path)` if it is missing or bad.

    One build per key: threads of this process and other processes wait for the builder."""
    if problem(target) is None:
        return target
    with locked(target):
        why = problem(target)                # again, under the lock: another writer may be done
        if why is None:
            return target
        if why != "missing":
            _discard(target, why)
        tmp = temp_name(target)
        try:
            build(tmp)
            _publish(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
    return target


def entries(targets: list[Path], build: Callable[[list[Path]], None]) -> list[Path]:
    """Like `entry` for files built together (a library and its metadata): all checked, else
    all rebuilt by `build(tmp_paths)` under the first target's lock."""
    if all(problem(t) is None for t in targets):
        return targets
    with locked(targets[0]):
        whys = [problem(t) for t in targets]
        if all(w is None for w in whys):
            return targets
        for t, why in zip(targets, whys):
            if why not in (None, "missing"):
                _discard(t, why)
        tmps = [temp_name(t) for t in targets]
        try:
            build(tmps)
            for tmp, t in zip(tmps, targets):
                _publish(tmp, t)
        finally:
            for tmp in tmps:
                if tmp.exists():
                    tmp.unlink()
    return targets


def write_text(target: Path, text: str) -> Path:
    """A checked entry holding `text` (rewritten only if missing or bad)."""
    return entry(target, lambda tmp: tmp.write_text(text))


__all__ = [
    "CacheWarning",
    "configured_root",
    "entries",
    "entry",
    "key_lock",
    "locked",
    "problem",
    "root",
    "subdir",
    "temp_name",
    "write_text",
]
