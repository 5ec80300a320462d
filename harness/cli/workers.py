"""``harness run-matrix --workers N | --gpus all | --executor ray [--address ADDR]``: the flags
that spread a matrix run over worker processes or a Ray cluster (:mod:`harness.matrix.pool`)."""

from __future__ import annotations

from ..errors import PrimewalkError

EXECUTORS = ("local", "ray")


def add_args(p) -> None:
    g = p.add_argument_group("parallel runs (the receipt equals the single-process one)")
    g.add_argument("--workers", metavar="N", default=None,
                   help="run the cells in N worker processes (cuda: one GPU each, round-robin over the "
                        "visible GPUs; cpu: the CPU threads divided among them); with --executor ray, "
                        "N Ray actors")
    g.add_argument("--gpus", metavar="all|I,J,..", default=None,
                   help="one worker per GPU: every visible GPU, or these (implies --backend cuda)")
    g.add_argument("--executor", choices=EXECUTORS, default=None,
                   help="local: worker processes on this host (default with --workers/--gpus); ray: Ray "
                        "actors, one GPU each (pip install 'primewalk[cluster]')")
    g.add_argument("--address", metavar="ADDR", default=None,
                   help="the Ray cluster to use with --executor ray (default: $RAY_ADDRESS, else a local "
                        "Ray instance)")


def parallel_requested(args) -> bool:
    return any(getattr(args, k) is not None for k in ("workers", "gpus", "executor", "address"))


def backend_for(args) -> str | None:
    """The backend to load the spec with: ``--gpus`` means cuda unless ``--backend`` says otherwise
    (which is refused)."""
    if args.gpus is not None:
        if args.backend not in (None, "cuda"):
            raise PrimewalkError(f"--gpus runs one worker per GPU on the cuda backend; --backend says {args.backend}")
        return "cuda"
    return args.backend


def _workers(text) -> int | None:
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise PrimewalkError(f"--workers: expected a positive integer, got {text!r}")
    return n


def _gpus(text) -> list | None:
    """``all`` -> None (every visible GPU); ``0,1`` -> ["0", "1"]."""
    if text is None or text == "all":
        return None
    gpus = [g.strip() for g in text.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise PrimewalkError(f"--gpus: expected all or distinct GPU indices like 0,1, got {text!r}")
    return gpus


def executor_from_args(args, spec):
    """(executor, workers) for the parallel flags of ``args`` on ``spec``'s backend; workers None
    means the executor's default. Raises a one-line error for a combination that cannot run."""
    workers = _workers(args.workers)
    kind = args.executor or "local"
    if args.address is not None and kind != "ray":
        raise PrimewalkError("--address names a Ray cluster; it needs --executor ray")
    if kind == "ray":
        if args.gpus is not None:
            raise PrimewalkError("--gpus places local workers; with --executor ray each worker gets one of the "
                                 "cluster's GPUs from Ray (use --workers N)")
        from ..matrix.ray_workers import RayExecutor, import_ray

        import_ray()  # the missing extra is named before anything starts
        return RayExecutor(args.address), workers
    from ..matrix.local_workers import LocalExecutor, worker_envs

    if spec.backend == "cpu" and workers is None:
        raise PrimewalkError("--executor local on the cpu backend: give the number of workers (--workers N)")
    envs = worker_envs(spec.backend, workers, _gpus(args.gpus) if args.gpus is not None else None)
    return LocalExecutor(envs), len(envs)
