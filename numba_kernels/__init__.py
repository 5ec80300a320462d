"""primewalk's kernels: see README.md here. Importing the package makes Numba's on-disk cache safe
for concurrent processes (:mod:`numba_kernels.diskcache`)."""

from . import diskcache

diskcache.install()
