"""numba_kernels.diskcache: two processes saving different specialisations of one function into
one cache directory at the same moment (numba issue #4807), run with Numba's index/data files
as they are -- unwrapped, the race is forced and shows; wrapped, every signature loads its own data.

The race is made certain, not left to timing: each process's index read waits on a barrier
(a file per process, both must exist) before it returns, so both read the index before either
writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SAVER = """
    import json, os, sys, time
    from numba.core import caching
    wrap, cache, me, other = sys.argv[1] == "1", sys.argv[2], sys.argv[3], sys.argv[4]
    if wrap:
        from numba_kernels import diskcache
        assert diskcache.install()
    cls = caching.IndexDataCacheFile
    read = cls._load_index

    def slow_read(self):
        out = read(self)
        open(os.path.join(cache, "arrived-" + me), "w").close()
        t = time.time()
        while not os.path.exists(os.path.join(cache, "arrived-" + other)) and time.time() - t < 3:
            time.sleep(0.01)
        return out

    cls._load_index = slow_read
    f = cls(cache, "twin-1.py3", "stamp")
    f.save(("sig", me), {"code for": me})
    print(json.dumps("saved"))
"""

_LOADER = """
    import json, sys
    from numba.core import caching
    f = caching.IndexDataCacheFile(sys.argv[1], "twin-1.py3", "stamp")
    print(json.dumps({k: f.load(("sig", k)) for k in ("a", "b")}))
"""


def _race(tmp_path, wrap):
    cache = tmp_path / ("wrapped" if wrap else "plain")
    cache.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SAVER), "1" if wrap else "0", str(cache), me,
                               other], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me, other in (("a", "b"), ("b", "a"))]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOADER), str(cache)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_unwrapped_numba_loses_or_crosses_an_entry(tmp_path):
    """The forced race on Numba's own code: both saves take data file 1, so at least one signature
    loads nothing or the other signature's data (what the wrapper must prevent)."""
    got = _race(tmp_path, wrap=False)
    assert got != {"a": {"code for": "a"}, "b": {"code for": "b"}}


def test_wrapped_saves_keep_every_signature_with_its_own_data(tmp_path):
    """The same race with the lock: the second save waits, reads the first's index, takes the next
    number (the barrier times out for the process that waits for the lock: 3 s)."""
    assert _race(tmp_path, wrap=True) == {"a": {"code for": "a"}, "b": {"code for": "b"}}


def test_the_package_import_installs_it():
    code = "import numba_kernels; from numba.core import caching; print(caching.IndexDataCacheFile.save._primewalk_locked)"
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr[-2000:]
