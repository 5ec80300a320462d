"""The CPU twin's thread count, and the machine's load that receipts record beside timings.

The CPU twin spreads independent outputs over Numba threads (``prange``; never a reduction, so
the thread count never changes a bit). How many threads, decided once when the cpu backend is
created (:func:`configure`):

1. ``PRIMEWALK_THREADS=N``: N (at most Numba's maximum, ``NUMBA_NUM_THREADS``, which defaults to
   the machine's cores).
2. ``NUMBA_NUM_THREADS`` set: Numba's setting, as it is.
3. Otherwise, *auto*: the cores that are free right now -- the usable cores minus the CPUs that
   other processes kept busy over a :data:`SAMPLE_S` sample of ``/proc/stat`` (rounded to the
   nearest whole CPU), and at least 1.

Why: Numba's OpenMP pool makes every parallel loop wait for all its threads. When another job
holds a core, each of the thousands of small loops of a decode step waits for a descheduled
thread, and a run collapses (the tiny matrix: about 10 s on one thread against 40-100 s on two,
beside a busy process on two cores; the README's "Threads and load" table has the numbers). So
the twin takes only the cores nobody else is using. Unless ``OMP_WAIT_POLICY`` is set, it also
sets OpenMP's wait policy to ``PASSIVE`` (idle threads sleep instead of spinning), which keeps
a run from collapsing when a competing job starts after the thread count was chosen.

:func:`machine_load` is what a receipt records: the load averages and the usable cores.
"""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.1  # seconds of /proc/stat sampled to count the busy CPUs
_SAMPLE = object()  # choose_threads' default: sample the busy CPUs now


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def machine_load() -> dict:
    """``{"loadavg": [1 min, 5 min, 15 min], "cores": usable cores}`` (loadavg None where the
    platform has none)."""
    try:
        avg = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        avg = None
    return {"loadavg": avg, "cores": usable_cores()}


def _cpu_times():
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()[1:]
    values = [int(x) for x in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]), idle


def busy_cpus(sample_s: float = SAMPLE_S) -> float | None:
    """How many CPUs the machine kept busy over ``sample_s`` seconds, while this process slept
    (None where ``/proc/stat`` cannot be read)."""
    try:
        total0, idle0 = _cpu_times()
        time.sleep(sample_s)
        total1, idle1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    dt = total1 - total0
    if dt <= 0:
        return None
    n = os.cpu_count() or 1
    return n * (dt - (idle1 - idle0)) / dt


def choose_threads(environ=None, maximum: int | None = None, busy=_SAMPLE) -> tuple[int, str]:
    """(threads, why) by the rule of the module docstring. ``maximum``: Numba's maximum (default
    ``numba.config.NUMBA_NUM_THREADS``); ``busy``: the busy CPUs (default: sampled now)."""
    env = os.environ if environ is None else environ
    if maximum is None:
        import numba

        maximum = int(numba.config.NUMBA_NUM_THREADS)
    text = env.get("PRIMEWALK_THREADS", "").strip()
    if text:
        from ..errors import PrimewalkError

        if not text.isdecimal() or int(text) < 1:
            raise PrimewalkError(f"PRIMEWALK_THREADS: expected a positive integer, got {text!r}")
        return min(int(text), maximum), "PRIMEWALK_THREADS"
    if env.get("NUMBA_NUM_THREADS"):
        return maximum, "NUMBA_NUM_THREADS"
    cores = min(usable_cores(), maximum)
    if busy is _SAMPLE:
        busy = busy_cpus()
    if busy is None:
        return cores, "auto (load unknown)"
    free = max(1, min(cores, cores - int(busy + 0.5)))
    return free, f"auto ({busy:.1f} of {os.cpu_count() or 1} CPUs busy)"


def configure(environ=None) -> tuple[int, str]:
    """Choose the thread count (:func:`choose_threads`), set OpenMP's wait policy to PASSIVE
    unless ``OMP_WAIT_POLICY`` is set, and apply the count to Numba. Returns (threads, why)."""
    env = os.environ if environ is None else environ
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when Numba first starts its pool
    import numba

    n, why = choose_threads(env)
    numba.set_num_threads(n)
    return n, why
