"""Fragmentation maths over synthetic torch.cuda.memory_snapshot() structures."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.probe.fragmentation import (
    external_fragmentation,
    free_block_sizes,
    free_block_stats,
    reserved_bytes_by_device,
    sum_of_squares_fragmentation,
)

MiB = 1024 * 1024


def block(size: int, state: str = "inactive") -> dict[str, Any]:
    return {"address": 0, "size": size, "requested_size": size, "state": state, "frames": []}


def segment(*blocks: dict[str, Any], segment_type: str = "large", device: int = 0) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": device,
        "address": 0,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": segment_type,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": list(blocks),
    }


def test_empty_snapshot_has_no_free_memory_and_no_fragmentation() -> None:
    stats = free_block_stats([])
    assert stats.free_blocks == 0
    assert stats.free_bytes == 0
    assert stats.largest_free_block_bytes == 0
    assert stats.fragmentation_ratio == 0.0
    assert stats.fragmentation_sq_ratio == 0.0


def test_all_allocated_is_not_fragmented() -> None:
    snapshot = [
        segment(block(20 * MiB, "active_allocated"), block(12 * MiB, "active_allocated")),
        segment(block(2 * MiB, "active_allocated"), segment_type="small"),
    ]
    stats = free_block_stats(snapshot)
    assert (stats.free_blocks, stats.free_bytes, stats.largest_free_block_bytes) == (0, 0, 0)
    assert stats.fragmentation_ratio == 0.0
    assert stats.fragmentation_sq_ratio == 0.0


def test_one_segment_with_one_free_block_is_not_fragmented() -> None:
    snapshot = [segment(block(8 * MiB, "active_allocated"), block(24 * MiB))]
    stats = free_block_stats(snapshot)
    assert stats.free_blocks == 1
    assert stats.free_bytes == 24 * MiB
    assert stats.largest_free_block_bytes == 24 * MiB
    assert stats.fragmentation_ratio == 0.0
    assert stats.fragmentation_sq_ratio == 0.0


def test_one_segment_split_by_allocations() -> None:
    # free 6 | used 4 | free 2: a 7 MiB request fails although 8 MiB are free.
    snapshot = [segment(block(6 * MiB), block(4 * MiB, "active_allocated"), block(2 * MiB))]
    stats = free_block_stats(snapshot)
    assert stats.free_blocks == 2
    assert stats.free_bytes == 8 * MiB
    assert stats.largest_free_block_bytes == 6 * MiB
    assert stats.fragmentation_ratio == pytest.approx(1 - 6 / 8)
    assert stats.fragmentation_sq_ratio == pytest.approx(1 - (36 + 4) / 64)


def test_many_segments_pool_their_free_blocks() -> None:
    snapshot = [
        segment(block(10 * MiB), block(10 * MiB, "active_allocated")),
        segment(block(5 * MiB, "active_allocated"), block(5 * MiB)),
        segment(block(5 * MiB), block(3 * MiB, "active_pending_free"), block(5 * MiB)),
    ]
    stats = free_block_stats(snapshot)
    assert stats.free_blocks == 4
    assert stats.free_bytes == 25 * MiB
    assert stats.largest_free_block_bytes == 10 * MiB
    assert stats.fragmentation_ratio == pytest.approx(1 - 10 / 25)
    assert stats.fragmentation_sq_ratio == pytest.approx(1 - (100 + 3 * 25) / 625)


def test_n_equal_blocks_give_one_minus_one_over_n() -> None:
    sizes = [4 * MiB] * 8
    assert external_fragmentation(sizes) == pytest.approx(1 - 1 / 8)
    assert sum_of_squares_fragmentation(sizes) == pytest.approx(1 - 1 / 8)


def test_sum_of_squares_sees_spread_that_largest_block_ignores() -> None:
    # Same largest block and total, different spread of the rest.
    one_remainder = [50, 50]
    many_crumbs = [50] + [1] * 50
    assert external_fragmentation(one_remainder) == external_fragmentation(many_crumbs)
    assert sum_of_squares_fragmentation(many_crumbs) > sum_of_squares_fragmentation(one_remainder)


def test_pending_free_and_allocated_blocks_are_not_free() -> None:
    snapshot = [segment(block(MiB, "active_allocated"), block(MiB, "active_pending_free"), block(MiB))]
    assert free_block_sizes(snapshot) == [MiB]


def test_small_segments_are_excluded_by_default() -> None:
    snapshot = [
        segment(block(30 * MiB)),
        segment(block(MiB), block(MiB, "active_allocated"), segment_type="small"),
    ]
    assert free_block_sizes(snapshot) == [30 * MiB]
    assert sorted(free_block_sizes(snapshot, segment_type=None)) == [MiB, 30 * MiB]
    assert free_block_stats(snapshot).fragmentation_ratio == 0.0


def test_device_filter_keeps_one_device() -> None:
    snapshot = [
        segment(block(4 * MiB), device=0),
        segment(block(6 * MiB), block(2 * MiB), device=1),
    ]
    assert free_block_stats(snapshot, device=0).free_bytes == 4 * MiB
    stats1 = free_block_stats(snapshot, device=1)
    assert (stats1.free_bytes, stats1.largest_free_block_bytes) == (8 * MiB, 6 * MiB)
    assert free_block_stats(snapshot).free_bytes == 12 * MiB
    assert reserved_bytes_by_device(snapshot) == {0: 4 * MiB, 1: 8 * MiB}


def test_odd_entries_are_skipped_not_raised_on() -> None:
    snapshot: list[Any] = [
        "not a segment",
        {"segment_type": "large"},  # no blocks
        {"segment_type": "large", "blocks": "nope"},
        {
            "segment_type": "large",
            "blocks": [
                {"state": "inactive"},  # no size
                {"state": "inactive", "size": "12"},
                {"state": "inactive", "size": True},
                {"state": "inactive", "size": -5},
                {"state": "inactive", "size": 0},
                None,
                {"state": "inactive", "size": 7},
            ],
        },
    ]
    assert free_block_sizes(snapshot) == [7]
    assert reserved_bytes_by_device(snapshot) == {}
