"""Sampling with a counter-based RNG: reproducible on every machine and backend.

Random numbers come from a SplitMix64-style integer hash of (seed, session, position, stream):
no state, integer-only, so a token drawn at a position does not depend on what was drawn
before or on the device. Probabilities use the CPU twin's float32 ``exp32`` in a fixed order
(never numpy's SIMD exp, which differs between CPUs), so a sampled token is a pure function of
the logits' bits and the counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

M64 = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy (argmax, ties to the lowest index)
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def label(self) -> str:
        return "greedy" if self.greedy else f"t{self.temperature:g}"


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def counter_uniform(seed: int, session: int, position: int, stream: int = 0) -> float:
    """A uniform number in [0, 1) with 24 random bits (exact in float32) for the counter."""
    z = _mix(seed & M64)
    for part in (session, position, stream):
        z = _mix(z ^ (part & M64))
    return (z >> 40) / float(1 << 24)


def probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of logits / T in float32 with the twin's exp, sum in index order."""
    from numba_kernels import cpu

    z = (np.asarray(logits, np.float32) / np.float32(temperature)).astype(np.float32)
    e = np.empty_like(z)
    cpu.map_exp((z - z.max()).astype(np.float32), e)
    return cpu.normalise(e)


def pick(logits: np.ndarray, s: Sampling, session: int, position: int, stream: int = 0) -> int:
    """Greedy argmax, or a draw from softmax(logits / T) with the counter RNG."""
    if s.greedy:
        return int(np.argmax(logits))
    return draw(probs(logits, s.temperature), counter_uniform(s.seed, session, position, stream))


def draw(p: np.ndarray, u: float) -> int:
    """The first index whose running float32 sum (index order) exceeds u · total."""
    from numba_kernels import cpu

    return int(cpu.draw_index(np.asarray(p, np.float32), np.float32(u)))
