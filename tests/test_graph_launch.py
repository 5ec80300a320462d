"""Captured graphs launch with one ``cuGraphLaunch`` through the driver binding where it is there
(``numba_kernels.launch.Graph``), and fall back to cuda.core's ``Graph.launch`` where it is not.
No GPU needed: the graph and the driver are stand-ins."""

from __future__ import annotations

import types

import pytest

from numba_kernels import launch


class FakeCoreGraph:
    """cuda.core's executable graph, as far as Graph uses it."""

    def __init__(self):
        self.handle = object()
        self.core_launches = 0

    def launch(self, stream):
        self.core_launches += 1


def test_replay_goes_through_the_direct_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_direct_launch", lambda g: (lambda: calls.append(g.handle)))
    g = FakeCoreGraph()
    graph = launch.Graph(g, keep=[])
    graph.replay()
    graph.replay()
    assert calls == [g.handle, g.handle] and g.core_launches == 0


def test_a_direct_launch_that_does_not_fit_the_binding_falls_back_for_good(monkeypatch):
    def wrong_arity():
        raise TypeError("cuGraphLaunch() takes 2 positional arguments")

    monkeypatch.setattr(launch, "_direct_launch", lambda g: wrong_arity)
    monkeypatch.setattr(launch, "_legacy_stream", lambda: "stream 0")
    g = FakeCoreGraph()
    graph = launch.Graph(g, keep=[])
    graph.replay()
    graph.replay()
    assert g.core_launches == 2 and graph._direct is None


def test_a_failed_launch_raises(monkeypatch):
    """A driver error is an error (not a silent fallback): the step did not run."""
    driver = types.SimpleNamespace(
        CUstream=lambda h: ("stream", h),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0),
        cuGraphLaunch=lambda handle, stream: (700,))
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings", bindings)
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings.driver", driver)
    go = launch._direct_launch(FakeCoreGraph())
    assert go is not None
    with pytest.raises(RuntimeError, match="cuGraphLaunch failed: 700"):
        go()


def test_no_handle_no_direct_launch():
    assert launch._direct_launch(object()) is None
