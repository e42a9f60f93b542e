"""Memory budgets: a least-recently-used store bounded by bytes, not by count.

One analysis of a ViT-B/8 holds about 0.35 GB of attention, one of DeiT-Tiny about 2 MB, so a
cache that keeps "16 of them" is either wasteful or a way to run out of memory. Everything the
app keeps per image or per model goes through a :class:`ByteLRU` instead: each item is weighed
once when it is stored (and again when it grows), and the least recently used items leave
until the total fits the budget again.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from PIL import Image

MB = 1 << 20
DEFAULT_CACHE_MB = 1024  # analyses: a machine of 16 GB or more keeps 1 GiB of them (less on a smaller one)
DEFAULT_MODELS_MB = 1536  # loaded models and their timm twins: a ViT-B pair fits, a ViT-L alone
DEFAULT_SESSIONS_MB = 256  # the pictures the sessions keep (at most 9.4 MB each)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def machine_memory() -> int | None:
    """Bytes of memory this machine has (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def default_budgets(total: int | None = None) -> dict[str, float]:
    """The app's default budgets (MiB) for a machine with ``total`` bytes of memory (default:
    this one's): a 16-GB machine gets the full defaults (analyses 1 GiB, models 1.5 GiB,
    sessions 256 MiB), a smaller one a share in proportion (an 8-GB laptop: 512, 819, 128;
    never less than 256, 512, 64), so that the app never plans for more than a fifth of the machine."""
    total = machine_memory() if total is None else total
    if not total:
        return {"cache_mb": DEFAULT_CACHE_MB, "models_mb": DEFAULT_MODELS_MB, "sessions_mb": DEFAULT_SESSIONS_MB}
    mb = total / MB
    return {"cache_mb": float(min(DEFAULT_CACHE_MB, max(256, mb / 16))),
            "models_mb": float(min(DEFAULT_MODELS_MB, max(512, mb / 10))),
            "sessions_mb": float(min(DEFAULT_SESSIONS_MB, max(64, mb / 64)))}


def tensor_nbytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes held by the tensors and arrays in ``obj`` (nested lists, tuples, dicts, dataclass
    attributes are not followed: pass them in explicitly). Shared storages count once."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen:
            return 0
        seen.add(ptr)
        return storage.nbytes()
    if isinstance(obj, np.ndarray):
        base = obj if obj.base is None else obj.base
        if id(base) in seen:
            return 0
        seen.add(id(base))
        return int(getattr(base, "nbytes", obj.nbytes))
    if isinstance(obj, dict):
        return sum(tensor_nbytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_nbytes(v, seen) for v in obj)
    return 0


def image_nbytes(img: Image.Image) -> int:
    """Bytes Pillow holds for ``img``'s pixels: Pillow stores a pixel of two or more bands (RGB,
    RGBA, LA, CMYK, ...) in 4 bytes, an RGB picture's fourth unused; one band in 1 byte (1, L,
    P), 2 (I;16) or 4 (I, F). Counting an RGB picture's 3 bands, as the budgets did, missed a
    quarter of it: 93 MiB of the sessions' and analyses' pictures after 200 fresh sessions."""
    if len(img.getbands()) > 1:
        size = 4
    elif img.mode in ("I", "F"):
        size = 4
    else:
        size = 2 if img.mode.startswith("I;16") else 1
    return img.width * img.height * size


def module_nbytes(module: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights count once)."""
    seen: set[int] = set()
    return sum(tensor_nbytes(t, seen) for t in (*module.parameters(), *module.buffers()))


class ByteLRU(Generic[K, V]):
    """A thread-safe LRU map bounded by the bytes its values hold.

    ``sizeof(value)`` weighs an item. :meth:`put` stores an item and evicts the least recently
    used others until the total fits ``max_bytes``, never the keys in ``protect`` (the items in
    use). An item larger than the whole budget is not kept, unless ``keep_oversize`` (a model
    in use must stay loaded, whatever its size: then it is kept alone).
    """

    def __init__(self, max_bytes: int, sizeof: Callable[[V], int],
                 on_evict: Callable[[K, V], None] | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"a memory budget cannot be negative ({max_bytes} bytes)")
        self.max_bytes = int(max_bytes)
        self.sizeof = sizeof
        self.on_evict = on_evict
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._nbytes = 0
        self._reserved = 0  # bytes of work in flight counted in the budget (see reserve)
        self._lock = threading.RLock()
        self.evictions = 0

    def get(self, key: K) -> V | None:
        """The value for ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def get_quiet(self, key: K) -> V | None:
        """The value for ``key`` without making it the most recently used (None if absent)."""
        with self._lock:
            item = self._items.get(key)
            return None if item is None else item[0]

    def put(self, key: K, value: V, protect: Iterable[K] = (), keep_oversize: bool = False) -> bool:
        """Store ``value`` as the most recently used item; returns whether it was kept."""
        size = int(self.sizeof(value))
        evicted: list[tuple[K, V]] = []
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
            if size > self.max_bytes and not keep_oversize:
                kept = False
            else:
                self._items[key] = (value, size)
                self._nbytes += size
                kept = True
            evicted = self._shrink({key, *protect})
        self._notify(evicted)
        return kept

    def reweigh(self, key: K) -> None:
        """Weigh ``key``'s value again (it grew, e.g. a class map was added), then fit the budget."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return
            size = int(self.sizeof(item[0]))
            self._nbytes += size - item[1]
            self._items[key] = (item[0], size)
            if size > self.max_bytes:  # grew past the whole budget: it leaves, as a new one would
                self._items.pop(key)
                self._nbytes -= size
                evicted = []
            else:
                evicted = self._shrink({key})
        self._notify(evicted)

    @contextmanager
    def reserve(self, nbytes: int, protect: Iterable[K] = ()) -> Iterator[None]:
        """Count ``nbytes`` of work in flight (e.g. the analysis being computed) in the budget
        while the block runs: the least recently used items leave now to make room for it
        (never ``protect``), so that the PEAK, not only what is kept, stays within the budget."""
        with self._lock:
            self._reserved += int(nbytes)
            evicted = self._shrink(set(protect))
        self._notify(evicted)
        try:
            yield
        finally:
            with self._lock:
                self._reserved -= int(nbytes)

    def pop(self, key: K) -> V | None:
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self._nbytes -= item[1]
            return item[0]

    def _shrink(self, protect: set) -> list[tuple[K, V]]:
        """Evict least recently used items (never ``protect``) until the total fits; lock held."""
        evicted = []
        for k in list(self._items):
            if self._nbytes + self._reserved <= self.max_bytes:
                break
            if k in protect:
                continue
            v, size = self._items.pop(k)
            self._nbytes -= size
            self.evictions += 1
            evicted.append((k, v))
        return evicted

    def _notify(self, evicted: list[tuple[K, V]]) -> None:
        if self.on_evict is not None:
            for k, v in evicted:
                self.on_evict(k, v)

    @property
    def nbytes(self) -> int:
        """Bytes held now (the sum of the items' weights)."""
        return self._nbytes

    @property
    def reserved(self) -> int:
        """Bytes of work in flight counted in the budget now."""
        return self._reserved

    def items(self) -> list[tuple[K, V]]:
        """(key, value) pairs, least recently used first (nothing is touched)."""
        with self._lock:
            return [(k, v) for k, (v, _) in self._items.items()]

    def keys(self) -> list[K]:
        """Keys, least recently used first."""
        with self._lock:
            return list(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


def return_large_frees_to_os() -> bool:
    """Ask glibc to hand blocks of 1 MiB or more straight back to the OS when freed.

    By default glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), so the
    attention maps and backward-pass buffers of a big model (30 MB each for ViT-B/8) come from
    the heap of whichever worker thread ran the request, and stay there after they are freed:
    the budgets above would bound what the app holds, not what the process takes. Measured
    (benchmarks/bench_memory.py: ViT-B/8, 24 photos, default 1 GiB cache): without this, 5.4 GiB
    resident at the end; with a 4 MiB threshold 2.5 GiB; with 1 MiB 2.2 GiB (the libraries, the
    model and the cache). DeiT-Tiny's blocks (under 1 MiB at batch 1) are unaffected.
    Returns False where this is not glibc (macOS, musl): nothing changes there.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_MMAP_THRESHOLD = -3
    return bool(mallopt(M_MMAP_THRESHOLD, 1 * MB))


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``). Blocks under the
    mmap threshold (a session's small tensors, strings, PIL's lines) come from heaps that glibc
    gives back only from their top: after 200 sessions 60-250 MB of freed memory stayed
    resident, in holes between blocks still in use. Cheap (milliseconds); the app calls it once
    a minute. False where this is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True
