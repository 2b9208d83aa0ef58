"""The autotune cache: the winning launch configuration per (device, kernel, dtypes, shape bucket).

One JSON file, `$METALFORGE_CACHE_DIR/autotune.json`, else `~/.cache/metalforge/autotune.json`:

    {"version": 1,
     "entries": {"<device> | <kernel>@<hash> | <dtypes> | <shape bucket>":
                     {"launch": {"threads_per_group": 128, ...}, "time_ms": 0.0123, ...}}}

- device: the GPU the timings were taken on ("Apple M2 Max" on MPS; "metalforge-sim").
- kernel hash: a hash of the traced graph (every op, dtype, axis, parameter and `mf.Const`
  value), which is what the generated code is made from: editing comments or formatting in the
  kernel's Python does not invalidate its tuning, changing what it computes does.
- dtypes: the dtype variables (or each tensor's dtype when there are none).
- shape bucket: each axis size rounded up to a power of two (``R:8,D:4096``).

The launcher looks a call up here (`tuned_launch`) and uses the entry under any explicit
override. A file that cannot be read is reported once with a warning and treated as empty; the
next autotune rewrites it. A write holds a lock (`fcntl.flock` on `autotune.json.lock`, and a
per-file lock between threads) while it merges with what is on disk, writes a temporary file
unique to the writer and moves it into place with `os.replace`, so concurrent tuners (threads or
processes) lose no entries and a reader never sees a half-written file.

Damage never fails a call: a file that is not UTF-8 JSON of this version is ignored (as above),
and an entry that is not a `{"launch": {...}}` object, names options the kernel does not take,
or holds values the launch checks refuse (`schedule.policy.resolve`, which checks explicit
options too) is ignored with one warning naming the file, the entry and why; the call runs the
default launch.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from ..cache import CacheWarning, configured_root, locked, root, temp_name
from ..errors import LaunchError
from ..graph import ConstParam, Graph, Node, ScalarParam, TensorParam
from ..schedule.policy import TUNABLE, backend_launch, resolve
from .launch import merge

VERSION = 1
FILE_NAME = "autotune.json"


def cache_path() -> Path:
    """autotune.json in the configured cache folder (the private temporary one, see
    `metalforge.cache.root`, when there is no folder to configure: no home)."""
    return (configured_root() or root()) / FILE_NAME


# --------------------------------------------------------------------------- keys

@dataclass(frozen=True)
class TuneKey:
    device: str
    kernel: str          # the kernel's name
    graph_hash: str      # 16 hex digits of the graph's canonical text
    dtypes: str          # "T=f16" or "x=f32,w=f16"
    shape: str           # "R:8,D:4096"

    @property
    def text(self) -> str:
        return f"{self.device} | {self.kernel}@{self.graph_hash} | {self.dtypes} | {self.shape}"

    def __str__(self) -> str:
        return self.text


_DEVICE: dict[str, str] = {}


def device_name(backend: str) -> str:
    """The name of the GPU a backend runs on (memoised)."""
    name = _DEVICE.get(backend)
    if name is None:
        if backend == "mps":
            name = _apple_chip() or f"Apple GPU ({platform.machine()})"
        elif backend == "cuda" and torch.cuda.is_available():
            name = torch.cuda.get_device_name()
        else:
            name = f"metalforge-{backend}"
        name = _DEVICE.setdefault(backend, name)      # another thread's, if it was first
    return name


def _apple_chip() -> Optional[str]:
    """The SoC name ("Apple M2 Max") that holds the GPU, from sysctl on macOS."""
    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def graph_text(graph: Graph) -> str:
    """A canonical, stable text of everything the generated code depends on."""
    lines = [f"kernel {graph.name}"]
    for p in graph.params:
        if isinstance(p, TensorParam):
            dims = ",".join(f"{'^' if d.joined else ''}{d.name}{'*' if d.batch else ''}"
                            f"{'' if d.size is None else f'={d.size}'}" for d in p.dims)
            lines.append(f"tensor {p.name} {p.dtype.name} [{dims}]")
        elif isinstance(p, ScalarParam):
            lines.append(f"scalar {p.name} {p.dtype.name}")
        elif isinstance(p, ConstParam):
            lines.append(f"const {p.name}={graph.consts.get(p.name)!r}")
    ids: dict[Node, int] = {}
    for i, n in enumerate(graph.nodes()):
        ids[n] = i
        args = ",".join(str(ids[a]) for a in n.args)
        lines.append(f"%{i} {n.op} {n.attr!r} {n.dtype.name} [{','.join(n.axes)}]"
                     f"{' weak' if n.weak else ''} ({args})")
    for o in graph.outputs:
        lines.append(f"out %{ids[o.node]} {o.dtype.name} [{','.join(o.axes)}]")
    return "\n".join(lines)


_HASHES: dict[int, tuple[Graph, str]] = {}


def graph_hash(graph: Graph) -> str:
    hit = _HASHES.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    h = hashlib.sha256(graph_text(graph).encode()).hexdigest()[:16]
    _HASHES[id(graph)] = (graph, h)
    return h


def dtype_text(graph: Graph) -> str:
    if graph.dtype_vars:
        return ",".join(f"{v}={d.name}" for v, d in graph.dtype_vars.items())
    return ",".join(f"{t.name}={t.dtype.name}" for t in graph.tensors)


def bucket(n: int) -> int:
    """n rounded up to a power of two (0 stays 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def shape_text(graph: Graph, sizes: Mapping[str, int]) -> str:
    axes = dict.fromkeys(d.name for t in graph.tensors for d in t.dims)
    return ",".join(f"{a}:{bucket(sizes[a])}" for a in axes if a in sizes)


def key_for(graph: Graph, backend: str, sizes: Mapping[str, int]) -> TuneKey:
    return TuneKey(device_name(backend), graph.name, graph_hash(graph), dtype_text(graph),
                   shape_text(graph, sizes))


# --------------------------------------------------------------------------- the file

class TuneCache:
    """The entries of one cache file, loaded on first use (once: threads wait for it). Every
    change publishes a new entries dict (the warm path checks for one by identity)."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self._entries: Optional[dict[str, dict]] = None
        self._rejected: set[str] = set()
        self._checked: dict[tuple[str, Any], tuple[dict[str, Any], Optional[str]]] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<metalforge TuneCache {self.path}>"

    @property
    def entries(self) -> dict[str, dict]:
        if self._entries is None:
            with self._lock:
                if self._entries is None:
                    self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, dict]:
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as e:
            return self._unusable(f"cannot be read ({e})")
        try:
            data = json.loads(raw)                 # bytes: bad UTF-8 is a ValueError here too
        except (ValueError, RecursionError) as e:
            return self._unusable(f"is not valid JSON ({e})")
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            return self._unusable("does not hold an object with an \"entries\" object")
        if data.get("version") != VERSION:
            return self._unusable(f"has version {data.get('version')!r}; this metalforge "
                                  f"reads version {VERSION}")
        good = {k: v for k, v in data["entries"].items()
                if isinstance(v, dict) and isinstance(v.get("launch"), dict)}
        bad = [k for k in data["entries"] if k not in good]
        if bad:
            warnings.warn(f"metalforge: ignoring {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} "
                          f"of the autotune cache {self.path} that are not "
                          f"{{\"launch\": {{...}}}} objects: {', '.join(map(repr, bad[:3]))}"
                          f"{', ...' if len(bad) > 3 else ''}", CacheWarning, stacklevel=4)
        return good

    def _unusable(self, why: str) -> dict:
        warnings.warn(f"metalforge: the autotune cache {self.path} {why}; ignoring it (kernels "
                      "use their default launch policy; the next mf.autotune rewrites the "
                      "file)", CacheWarning, stacklevel=4)
        return {}

    def get(self, key: TuneKey | str) -> Optional[dict]:
        return self.entries.get(key.text if isinstance(key, TuneKey) else key)

    def launch_for(self, key: TuneKey, allowed: tuple[str, ...], family: Optional[str] = None,
                   under: Optional[Mapping[str, Any]] = None,
                   over: Optional[Mapping[str, Any]] = None) -> Optional[dict[str, Any]]:
        """The cached launch options for `key`, if any and if they still apply: every option one
        the kernel takes (`allowed`) and, given its `family`, values the launch checks accept
        between the backend's options `under` and the call's explicit options `over`. An entry
        that fails is ignored with one warning."""
        e = self.get(key)
        if e is None:
            return None
        launch = e["launch"]
        bad = [k for k in launch if k not in allowed]
        if bad:
            self._reject(key, f"option(s) {', '.join(bad)} do not apply to this kernel any more")
            return None
        if family is not None:          # checked once per (entry, explicit options)
            seen = (key.text, None if not over else tuple(sorted(over.items())))
            done = self._checked.get(seen)
            if done is None or done[0] is not launch:      # a write replaces the entry
                done = self._checked[seen] = (launch, _refused(family, under, launch, over))
            why = done[1]
            if why is not None:
                self._reject(key, why)
                return None
        return dict(launch)

    def _reject(self, key: TuneKey, why: str) -> None:
        if key.text not in self._rejected:
            self._rejected.add(key.text)
            warnings.warn(f"metalforge: ignoring the autotune cache entry '{key.text}' in "
                          f"{self.path}: {why}; re-run mf.autotune", CacheWarning, stacklevel=5)

    def put(self, key: TuneKey, entry: Mapping[str, Any]) -> None:
        """Store one entry (merged with the file's current content) and write the file."""
        try:
            self._write(key, entry)
        except OSError as e:
            warnings.warn(f"metalforge: cannot write the autotune cache {self.path} ({e}); the "
                          f"result is kept for this process only", CacheWarning, stacklevel=3)
            with self._lock:
                self._entries = {**self.entries, key.text: dict(entry)}

    def _write(self, key: TuneKey, entry: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with locked(self.path):
            fresh = TuneCache(self.path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheWarning)     # a corrupt file is replaced
                merged = dict(fresh.entries)
            merged[key.text] = dict(entry)
            tmp = temp_name(self.path)
            try:
                with open(tmp, "w") as f:
                    json.dump({"version": VERSION, "entries": merged}, f, indent=1,
                              sort_keys=True)
                    f.write("\n")
                os.replace(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self._entries = merged


def _refused(family: str, under: Optional[Mapping[str, Any]], tuned: Mapping[str, Any],
             over: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the launch checks (`resolve`, as for explicit options) refuse the tuned options
    between the backend's `under` and the explicit `over`; None when they take them, and when
    they refuse `over` without the tuned options too (that error is the caller's to see)."""
    try:
        resolve(family, merge(under, tuned, over))
        return None
    except (LaunchError, TypeError, ValueError) as e:
        why = f"its values are refused: {e}"
    if not over:
        return why
    try:
        resolve(family, merge(under, over))
    except (LaunchError, TypeError, ValueError):
        return None
    return f"{why} (under the explicit launch options {dict(over)})"


_CACHES: dict[Any, TuneCache] = {}


def env_lookup(name: str) -> Optional[tuple[Callable[[Any], Any], Any]]:
    """On POSIX, (get, key): `get(key)` is environment variable `name`'s raw bytes value, from
    the mapping of encoded names that `os.environ` keeps in step with its own updates (about
    ten times faster than `os.environ.get`, which encodes the name and decodes the value on
    every call); elsewhere None."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if os.name == "posix" and isinstance(data, dict) and encode is not None:
        return data.get, encode(name)
    return None


def _env_reader(name: str) -> Callable[[], Any]:
    """A cheap reader of one environment variable, for code that runs on every kernel call
    (`env_lookup`; elsewhere `os.environ.get`)."""
    found = env_lookup(name)
    if found is not None:
        get, key = found
        return lambda: get(key)
    return lambda: os.environ.get(name)


_CACHE_DIR = _env_reader("METALFORGE_CACHE_DIR")


def default_cache() -> TuneCache:
    """The cache at `cache_path()` (one object per $METALFORGE_CACHE_DIR value, so the file is
    read once per process; this runs on every kernel call, so it is kept cheap)."""
    env = _CACHE_DIR()
    c = _CACHES.get(env)
    if c is None:                                    # one object per value, the first made
        c = _CACHES.setdefault(env, TuneCache(cache_path()))
    return c


def tuned_launch(graph: Graph, backend: str, sizes: Mapping[str, int], family: str,
                 launch: Optional[Mapping[str, Any]] = None) -> Optional[dict[str, Any]]:
    """What the launcher uses under the explicit options `launch`: the tuned options for this
    call, when the launch checks accept them there (else None, with a warning)."""
    cache = default_cache()
    if not cache.entries:
        return None
    return cache.launch_for(key_for(graph, backend, sizes), TUNABLE.get(family, ()), family,
                            backend_launch(backend, family), launch)
