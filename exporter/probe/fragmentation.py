"""Free-block statistics over a ``torch.cuda.memory_snapshot()`` list of segments.

Pure functions, no torch: the snapshot is plain data. A segment is one ``cudaMalloc``
(``segment_type`` ``"large"`` or ``"small"``, ``total_size``, ``device``, ``blocks``); a
block has a ``size`` and a ``state``: ``"active_allocated"`` (a live tensor),
``"active_pending_free"`` (freed, waiting for another stream) or ``"inactive"`` (cached
and free for reuse). Only inactive blocks count as free.

Only large segments matter for "false OOM": small segments (2 MiB, for requests up to
1 MiB) never serve a large request, so their free blocks are excluded.

External fragmentation of the free memory ``f_1 .. f_n``:

* ``fragmentation_ratio = 1 - max(f) / sum(f)``: the share of free memory that a single
  request can not use. 0 when all free memory is one block.
* ``fragmentation_sq_ratio = 1 - sum(f_i^2) / sum(f)^2``: the same idea weighted over all
  blocks instead of only the largest; ``n`` equal blocks give ``1 - 1/n``.

With no free memory at all both are 0: nothing is lost to fragmentation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FREE_STATE = "inactive"
LARGE_SEGMENT = "large"


@dataclass(frozen=True)
class FreeBlockStats:
    """Free memory of one device's large segments, as the allocator caches it."""

    free_blocks: int
    free_bytes: int
    largest_free_block_bytes: int
    fragmentation_ratio: float
    fragmentation_sq_ratio: float


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _segments_of(
    segments: Iterable[Mapping[str, Any]], device: int | None, segment_type: str | None
) -> Iterable[Mapping[str, Any]]:
    for segment in segments:
        if not isinstance(segment, Mapping):
            continue
        if segment_type is not None and segment.get("segment_type") != segment_type:
            continue
        if device is not None and segment.get("device", device) != device:
            continue
        yield segment


def free_block_sizes(
    segments: Iterable[Mapping[str, Any]],
    *,
    device: int | None = None,
    segment_type: str | None = LARGE_SEGMENT,
) -> list[int]:
    """Sizes in bytes of the free (``inactive``) blocks, large segments only by default.

    ``device`` keeps only segments of that device (segments without a ``device`` key are
    kept); ``segment_type=None`` keeps small segments too. Entries that are not shaped
    like the snapshot's (missing sizes, odd types) are skipped, never raised on.
    """
    sizes: list[int] = []
    for segment in _segments_of(segments, device, segment_type):
        blocks = segment.get("blocks")
        if not isinstance(blocks, Sequence):
            continue
        for block in blocks:
            if not isinstance(block, Mapping) or block.get("state") != FREE_STATE:
                continue
            size = _int_or_none(block.get("size"))
            if size is not None and size > 0:
                sizes.append(size)
    return sizes


def external_fragmentation(free_sizes: Sequence[int]) -> float:
    """``1 - largest / total`` of the free block sizes; 0 with no free memory."""
    total = sum(free_sizes)
    if total <= 0:
        return 0.0
    return 1.0 - max(free_sizes) / total


def sum_of_squares_fragmentation(free_sizes: Sequence[int]) -> float:
    """``1 - sum(f^2) / sum(f)^2`` of the free block sizes; 0 with no free memory."""
    total = sum(free_sizes)
    if total <= 0:
        return 0.0
    squares = sum(size * size for size in free_sizes)
    # Exact integer arithmetic first; one rounding at the end keeps 1 block at exactly 0.
    return (total * total - squares) / (total * total)


def free_block_stats(segments: Iterable[Mapping[str, Any]], *, device: int | None = None) -> FreeBlockStats:
    """Free-block count, bytes, largest block and both fragmentation ratios."""
    sizes = free_block_sizes(segments, device=device)
    return FreeBlockStats(
        free_blocks=len(sizes),
        free_bytes=sum(sizes),
        largest_free_block_bytes=max(sizes, default=0),
        fragmentation_ratio=external_fragmentation(sizes),
        fragmentation_sq_ratio=sum_of_squares_fragmentation(sizes),
    )


def reserved_bytes_by_device(segments: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Bytes of all segments (large and small) per device index found in the snapshot."""
    reserved: dict[int, int] = {}
    for segment in _segments_of(segments, None, None):
        device = _int_or_none(segment.get("device"))
        size = _int_or_none(segment.get("total_size"))
        if device is None or size is None:
            continue
        reserved[device] = reserved.get(device, 0) + size
    return reserved
