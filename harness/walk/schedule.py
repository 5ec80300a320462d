"""The trunk schedule of a prime: which prompt rows run batched, which token by token.

A prompt of ``tp`` rows is split into *segments* at the prime split and the checkpoint row (when
given). Each segment either runs batched (``prime_chunk`` over row ranges) or as one chunk run
token by token. :func:`trunk_schedule` returns the chunks in execution order; together they cover
rows ``0..tp`` exactly, contiguously and in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: The fewest rows a segment needs to be primed batched; shorter segments run token by token.
PRIME_MIN_T = 32

#: The seed's ``gdn_chunk_size``: default boundaries and fractional points round down to it.
GDN_GRID = 64

#: ``ranges(n)`` cuts a batched segment of ``n`` rows into segment-local ``(start, end)`` pairs.
Ranges = Callable[[int], Iterable[tuple[int, int]]]


@dataclass(frozen=True)
class TrunkChunk:
    """One chunk of the trunk: absolute prompt rows ``[start, end)`` of segment
    ``[segment_start, segment_end)``.

    Invariants: ``segment_start <= start < end <= segment_end``. A non-batched chunk is its whole
    segment, run token by token; ``target_step`` (only ever set on non-batched chunks of an
    unsegmented prime) runs those tokens as target steps.
    """

    start: int
    end: int
    segment_start: int
    segment_end: int
    batched: bool
    target_step: bool

    @property
    def rows(self) -> int:
        return self.end - self.start


def trunk_schedule(
    tp: int,
    prime_split: int | None,
    ckpt_rel: int | None,
    tokenwise: bool,
    ranges: Ranges,
) -> list[TrunkChunk]:
    """Chunks that prime rows ``0..tp``, in execution order.

    Segments end at the sorted, de-duplicated stops among ``prime_split`` and ``ckpt_rel``, then
    at ``tp``; the prime is *segmented* when there is at least one stop. A segment ``[lo, hi)`` is
    batched when it has at least :data:`PRIME_MIN_T` rows and either it ends before the prompt
    does in a segmented prime, or ``tokenwise`` is false. A batched segment is cut by
    ``ranges(hi - lo)`` (segment-local pairs, shifted by ``lo`` here); ``ranges`` is called once
    per batched segment and never otherwise. Any other segment is one chunk run token by token,
    as target steps when the prime is unsegmented.

    Raises ValueError when ``tp < 1``, a stop lies outside ``(0, tp)``, or ``ranges`` does not
    cover its segment exactly with contiguous, non-empty, in-order ranges.
    """
    if tp < 1:
        raise ValueError(f"trunk schedule needs tp >= 1, got {tp}")
    for name, stop in (("prime_split", prime_split), ("ckpt_rel", ckpt_rel)):
        if stop is not None and not 0 < stop < tp:
            raise ValueError(f"{name}={stop} must lie strictly inside (0, {tp})")
    stops = sorted({stop for stop in (prime_split, ckpt_rel) if stop is not None})
    segmented = bool(stops)

    chunks = []
    lo = 0
    for hi in [*stops, tp]:
        batched = hi - lo >= PRIME_MIN_T and ((segmented and hi < tp) or not tokenwise)
        if batched:
            chunks.extend(
                TrunkChunk(lo + start, lo + end, lo, hi, batched=True, target_step=False)
                for start, end in _checked_ranges(ranges, hi - lo)
            )
        else:
            chunks.append(TrunkChunk(lo, hi, lo, hi, batched=False, target_step=not segmented))
        lo = hi
    return chunks


def _checked_ranges(ranges: Ranges, n: int) -> list[tuple[int, int]]:
    """``ranges(n)`` as a list, checked to tile ``0..n`` with contiguous non-empty ranges."""
    pieces = [(start, end) for start, end in ranges(n)]
    cursor = 0
    for start, end in pieces:
        if start != cursor or end <= start:
            raise ValueError(
                f"ranges({n}) must tile 0..{n} contiguously with non-empty ranges; "
                f"got ({start}, {end}) at row {cursor}"
            )
        cursor = end
    if cursor != n:
        raise ValueError(f"ranges({n}) must tile 0..{n} exactly; its ranges end at row {cursor}")
    return pieces


def chunk_ranges(n: int, chunk_rows: int | None) -> list[tuple[int, int]]:
    """Cut ``n`` rows into consecutive ``(start, end)`` pieces of ``chunk_rows`` rows.

    The last piece may be shorter; ``chunk_rows`` of None or ``<= 0`` means one piece. Zero rows
    give no pieces. Suitable as ``ranges`` for :func:`trunk_schedule` via
    ``lambda n: chunk_ranges(n, chunk_rows)``.
    """
    if n < 0:
        raise ValueError(f"cannot cut a negative row count ({n})")
    step = chunk_rows if chunk_rows is not None and chunk_rows > 0 else max(n, 1)
    return [(start, min(start + step, n)) for start in range(0, n, step)]
