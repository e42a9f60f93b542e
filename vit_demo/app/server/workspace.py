"""The app's files on disk: one private folder per running app, cleaned at start and on exit,
and a disk budget for what it writes.

``vit_demo_<random>/`` in the system's temp folder holds everything the app writes: Gradio's
uploads and cache (``gradio/``, made Gradio's ``GRADIO_TEMP_DIR`` by app.py), and inside it the
pictures sent to the browser (``gradio/views/``) and the slide PNGs, decks and animations
(``gradio/exports/``): inside Gradio's cache, so Gradio serves them without copying them. The
running app holds a lock on ``.lock`` in its folder (locked before it has that name); at start, the folders of apps that are no
longer running (their lock is free: killed, crashed) are removed, with the folders older
versions left behind (``vit_demo_views_*``, ``vit_demo_exports_*``, unused for six hours); on a
normal exit (Ctrl-C, SIGTERM) the app removes its own. :func:`trim` keeps a folder within a
disk budget, the oldest files first. Standard library only: app.py imports this before Gradio.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

PREFIX = "vit_demo_"
LEGACY = ("vit_demo_views_", "vit_demo_exports_")  # older versions' folders (no lock)
LEGACY_AGE_S = 6 * 3600

try:
    import fcntl
except ImportError:  # Windows: no stale-folder detection (its folders are removed on exit only)
    fcntl = None


def _lock(path: Path):
    """An open file holding an exclusive lock on ``path``, or None when another process holds it."""
    f = open(path, "a+")  # noqa: SIM115 - held open for the life of the app
    if fcntl is None:
        return f
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f
    except OSError:
        f.close()
        return None


def _lock_new(path: Path):
    """``path`` made already locked: locked under a temporary name, then renamed (the lock stays
    with the file). A sweep at another app's start never sees ``path`` unlocked while its app
    lives, as it could between creating the file and locking it."""
    if fcntl is None:  # Windows: no locks to race for (and no renaming an open file)
        return _lock(path)
    tmp = path.with_name(path.name + ".new")
    held = _lock(tmp)
    os.replace(tmp, path)
    return held


def clean_stale(parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove the folders of apps that no longer run (and old versions' folders unused for six
    hours) from ``parent`` (default: the temp folder); returns what was removed."""
    parent = Path(parent or tempfile.gettempdir())
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    now = time.time()
    for d in entries:
        try:
            mine = not hasattr(os, "getuid") or d.stat().st_uid == os.getuid()
            if not d.is_dir() or d.is_symlink() or not mine:
                continue
            if d.name.startswith(PREFIX) and (d / ".lock").is_file():
                if fcntl is None:
                    continue
                held = _lock(d / ".lock")
                stale = held is not None
                if held is not None:
                    held.close()
            elif d.name.startswith(LEGACY):
                stale = now - d.stat().st_mtime > LEGACY_AGE_S
            else:
                continue
        except OSError:
            continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


class Workspace:
    """One running app's folder (see the module docstring)."""

    def __init__(self, parent: str | os.PathLike | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        self._lockfile = _lock_new(self.root / ".lock")
        self.gradio = self.root / "gradio"
        self.views = self.gradio / "views"
        self.exports = self.gradio / "exports"
        self.exports_budget = 512 << 20  # bytes of slides, decks and animations (the app sets its --exports-mb)
        for d in (self.gradio, self.views, self.exports):
            d.mkdir(exist_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None


_current: Workspace | None = None
_lock_current = threading.Lock()


def workspace() -> Workspace:
    """This process's workspace, made on first use (after removing stale ones) and removed at exit."""
    global _current
    with _lock_current:
        if _current is None or not _current.root.is_dir():
            clean_stale()
            _current = Workspace()
            atexit.register(_current.remove)
        return _current


def folder_bytes(folder: str | os.PathLike) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def fresh(folder: str | os.PathLike) -> Path:
    """A new folder with a random name inside ``folder`` (one per export: no two users' files
    share a name, and a file's address says nothing about the server)."""
    return Path(tempfile.mkdtemp(dir=folder, prefix=""))


def trim(folder: str | os.PathLike, max_bytes: int, max_age_s: float | None = None) -> int:
    """Remove the files under ``folder`` older than ``max_age_s`` (when given), then the oldest
    until it holds at most ``max_bytes`` (never the newest: the one just written), and the
    folders left empty; returns the bytes removed."""
    files, dirs = [], []
    for dirpath, subdirs, names in os.walk(folder):
        dirs += [os.path.join(dirpath, d) for d in subdirs]
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
    total = sum(s for _, s, _ in files)
    freed = 0
    files.sort()
    now = time.time()
    emptied = set()
    for mtime, size, p in files[:-1]:  # never the newest
        old = max_age_s is not None and now - mtime > max_age_s
        if total - freed <= max_bytes and not old:
            continue
        try:
            os.unlink(p)
            freed += size
            emptied.add(os.path.dirname(p))
        except OSError:
            pass
    for d in sorted(dirs, key=len, reverse=True):  # the deepest first
        try:
            if d in emptied or now - os.stat(d).st_mtime > 600:  # not one just made for a file about to be written
                os.rmdir(d)  # only if empty
        except OSError:
            pass
    return freed
