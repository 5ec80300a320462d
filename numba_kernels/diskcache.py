"""Numba's on-disk cache (the CPU twins' and the MMA emulation's ``@njit(cache=True)``), made safe
for processes that compile into one cache directory at the same time.

Numba keeps, per function, an index (``name-line.pyXY.nbi``: {signature: data file}) and numbered
data files (``.1.nbc``, ``.2.nbc`` ...). Its ``save`` reads the index, takes the first number no
entry uses, writes the index, then the data. Two processes that compile *different*
specialisations of one function at once both read the same index and both take number 1: one
index entry is lost and, worse, the survivor can name a data file that holds the other
signature's machine code -- a twin that segfaults or computes other bits in the next process
that loads it (numba issue #4807; seen here with two simulator comparisons of different models
started together on an empty cache).

:func:`install` wraps ``IndexDataCacheFile.save`` and ``load`` in an exclusive ``flock`` on one
lock file in the cache directory (``primewalk-numba.lock``), so that choosing a number, writing
the index and writing the data are one step that no other process's save or load interleaves
with. Loads stay fast (the lock is held while two small files are read). Where ``fcntl`` is
missing (Windows) or the lock file cannot be opened (a read-only cache directory), the wrapper
does what numba does unwrapped."""

from __future__ import annotations

import contextlib
import os

try:
    import fcntl
except ImportError:  # pragma: no cover  (not POSIX)
    fcntl = None

LOCK_NAME = "primewalk-numba.lock"


@contextlib.contextmanager
def locked(cache_path):
    """An exclusive lock on ``cache_path``'s lock file for the ``with`` body (none where it cannot be
    taken: see the module docstring)."""
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(os.path.join(cache_path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def install(cls=None) -> bool:
    """Wrap ``cls.save`` and ``cls.load`` (default numba's ``IndexDataCacheFile``) once; returns
    whether they are wrapped."""
    if cls is None:
        from numba.core import caching

        cls = getattr(caching, "IndexDataCacheFile", None)
    if cls is None or not hasattr(cls, "save") or not hasattr(cls, "load"):
        return False
    if getattr(cls.save, "_primewalk_locked", False):
        return True
    save, load = cls.save, cls.load

    def locked_save(self, key, data):
        with locked(self._cache_path):
            return save(self, key, data)

    def locked_load(self, key):
        with locked(self._cache_path):
            return load(self, key)

    locked_save._primewalk_locked = locked_load._primewalk_locked = True
    cls.save, cls.load = locked_save, locked_load
    return True
