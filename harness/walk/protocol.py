"""The resumable prime walker: a prime run one chunk at a time, so a caller can yield between
chunks (e.g. to let another session decode) and still get the exact result of an unyielded prime.

:class:`PrimeWalker` is the protocol, :class:`GuardedWalker` implements its bookkeeping for
concrete walkers, and :func:`advance_prime` / :func:`finish_prime` drive any walker.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

log = logging.getLogger(__name__)

Output = TypeVar("Output")
T = TypeVar("T")


class PrimeChunk(NamedTuple):
    """One executed chunk: its phase name (e.g. ``"mtp-trunk"``) and the prompt rows it ran."""

    phase: str
    rows: int


class PrimeProgress(NamedTuple):
    """What one :func:`advance_prime` call did: the last chunk it ran (None if none), how many
    chunks it ran, and how many remain."""

    chunk: PrimeChunk | None
    chunks_done: int
    remaining_chunks: int


class PrimeError(Exception):
    """A prime walker was misused or is unusable; the message is one line."""


class PrimeWalker(ABC, Generic[Output]):
    """A prime split into a tape of chunks, run one chunk per :meth:`advance_chunk`.

    Invariants every walker keeps:

    - The chunk tape is frozen when the walker is created; nothing done between chunks changes it.
    - Each :meth:`advance_chunk` consumes exactly one chunk: :meth:`remaining_chunks` drops by one.
    - An error inside a chunk leaves the walker where it was (not advanced) and poisoned: every
      later :meth:`advance_chunk` or :meth:`finish` raises :class:`PrimeError` naming the
      original error.
    - :meth:`finish` rejects an incomplete prime (chunks remaining) with :class:`PrimeError`.
    - A finished walker does no more work: :meth:`advance_chunk` and :meth:`finish` raise.
    - Yielded runs (one chunk per call, other work in between) and drained runs (all chunks in
      one call) execute identical tapes.
    """

    @abstractmethod
    def remaining_chunks(self) -> int:
        """Chunks not yet run."""

    @abstractmethod
    def advance_chunk(self) -> PrimeChunk:
        """Run the next chunk and return it."""

    @abstractmethod
    def finish(self) -> Output:
        """Complete the prime after its last chunk and return its output."""

    def next_chunk(self) -> PrimeChunk | None:
        """The chunk the next advance would run, without running it; None if none remain or the
        walker cannot tell."""
        return None


class GuardedWalker(PrimeWalker[Output]):
    """A :class:`PrimeWalker` whose invariants are enforced around a subclass's
    :meth:`_advance` and :meth:`_finish`.

    The guard rejects calls on a poisoned or finished walker, advancing with no chunks left,
    finishing early, and an advance that does not consume exactly one chunk; any exception from
    ``_advance`` / ``_finish`` poisons the walker and propagates unchanged. The subclass must move
    its cursor only once a chunk has succeeded, so a failed chunk leaves it unadvanced.
    Subclasses call ``super().__init__()``.
    """

    def __init__(self) -> None:
        self._poisoned_by: BaseException | None = None
        self._finished = False

    @abstractmethod
    def _advance(self) -> PrimeChunk:
        """Run the next chunk (at least one remains) and move the cursor past it on success."""

    @abstractmethod
    def _finish(self) -> Output:
        """Produce the output of a complete prime."""

    def advance_chunk(self) -> PrimeChunk:
        self._check_usable()
        before = self.remaining_chunks()
        if before == 0:
            raise PrimeError("prime walker has no chunks left to advance")
        chunk = self._guarded(self._advance)
        consumed = before - self.remaining_chunks()
        if consumed != 1:
            self._poisoned_by = PrimeError(f"advance consumed {consumed} chunks instead of one")
            raise self._poisoned_by
        return chunk

    def finish(self) -> Output:
        self._check_usable()
        remaining = self.remaining_chunks()
        if remaining:
            raise PrimeError(f"prime incomplete: {remaining} chunks remain")
        output = self._guarded(self._finish)
        self._finished = True
        return output

    def _check_usable(self) -> None:
        if self._poisoned_by is not None:
            cause = _one_line(self._poisoned_by)
            raise PrimeError(f"prime walker poisoned by an earlier error: {cause}")
        if self._finished:
            raise PrimeError("prime walker already finished")

    def _guarded(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except BaseException as err:
            self._poisoned_by = err
            raise


def _one_line(err: BaseException) -> str:
    first = str(err).strip().splitlines()
    return f"{type(err).__name__}: {first[0]}" if first else type(err).__name__


def advance_prime(
    walker: PrimeWalker,
    yield_after_chunk: bool,
    observe: Callable[[PrimeChunk], object] | None = None,
) -> PrimeProgress:
    """Run chunks until none remain, or exactly one when ``yield_after_chunk`` is true (none if
    none remain). ``observe(chunk)`` is called after each chunk, in order; errors propagate."""
    chunk = None
    done = 0
    while walker.remaining_chunks() > 0:
        chunk = walker.advance_chunk()
        done += 1
        if observe is not None:
            observe(chunk)
        if yield_after_chunk:
            break
    return PrimeProgress(chunk, done, walker.remaining_chunks())


def finish_prime(walker: PrimeWalker[Output]) -> Output:
    """Finish a fully advanced walker and return its output (see :meth:`PrimeWalker.finish`)."""
    return walker.finish()


def trace_chunk(chunk: PrimeChunk) -> None:
    """An ``observe`` hook for :func:`advance_prime`: logs each chunk at debug level, and is
    silent otherwise."""
    log.debug("prime chunk %s rows=%d", chunk.phase, chunk.rows)
