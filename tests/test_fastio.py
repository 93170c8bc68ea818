"""actors/fastio.py: reads that wait only when they must, and still yield.

A regular file's descriptor never blocks, so it stands for a peer whose
bytes are always ready (one flooding the broker): what matters is when the
reader lets another task run.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from actors.fastio import CHECKPOINT_EVERY, FastIO

FULL = 64 * 1024  # a read this large means more is waiting (a flood)


async def reads_before_another_task_runs(path: Path, reads: int, size: int) -> int:
    """How many reads of ``size`` bytes a FastIO had returned when a task
    started beside it ran (``reads``: none took a checkpoint; 0 or 1: the
    first did, Trio running the two in either order after it)."""
    fd = os.open(path, os.O_RDONLY)
    io = FastIO(trio.lowlevel.FdStream(fd))
    done = 0
    seen: list[int] = []

    async def note() -> None:
        seen.append(done)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(note)
            for _ in range(reads):
                assert len(await io.receive_some(size)) == size
                done += 1
    finally:
        await io.stream.aclose()  # type: ignore[union-attr]
    return seen[0]


async def test_a_reader_of_full_reads_yields_at_each_one(tmp_path: Path) -> None:
    path = tmp_path / "flood"
    reads = CHECKPOINT_EVERY - 1
    path.write_bytes(b"x" * (reads * FULL))
    assert await reads_before_another_task_runs(path, reads, FULL) <= 1


async def test_small_reads_take_no_checkpoint_until_the_sixteenth(tmp_path: Path) -> None:
    path = tmp_path / "calls"
    reads = CHECKPOINT_EVERY - 1
    path.write_bytes(b"x" * (reads * 300))  # (a call's line is a few hundred bytes)
    assert await reads_before_another_task_runs(path, reads, 300) == reads
