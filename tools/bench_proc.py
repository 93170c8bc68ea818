"""CPU time and memory of a process, for ``mcpbroker bench`` and the benchmark harness.

Reads ``/proc`` on Linux (no dependency) and falls back to psutil elsewhere
when it is installed; where neither works the figures are ``None`` and the
reports say "n/a". RSS is what ``ps`` shows; USS (memory private to the
process, what it would give back on exit) needs ``smaps_rollup``; peak RSS is
the kernel's high-water mark (``VmHWM``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import attrs

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@attrs.frozen
class Memory:
    rss: int | None
    uss: int | None
    pss: int | None  # proportional: shared pages split among their users (sums add up)
    peak_rss: int | None

    def as_dict(self) -> dict[str, int | None]:
        return attrs.asdict(self)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far (children not included)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        pass
    psutil = _psutil()
    if psutil is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    except psutil.Error:
        return None


def machine_busy_seconds() -> float | None:
    """CPU time every core of the machine has spent busy so far (Linux; else None).

    Compared with the CPU time of the processes a benchmark watches, it shows
    how much of the machine something else was using meanwhile.
    """
    fields = _proc_stat()
    if fields is None:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle - _steal(fields)) / _TICKS


def machine_stolen_seconds() -> float | None:
    """CPU time the hypervisor gave other virtual machines while ours wanted it
    ("steal" in /proc/stat; Linux, else None): a slow run with much stolen time
    measured the host, not the broker."""
    fields = _proc_stat()
    return None if fields is None else _steal(fields) / _TICKS


def _proc_stat() -> list[int] | None:
    try:
        with open("/proc/stat", "rb") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _steal(fields: list[int]) -> int:
    return fields[7] if len(fields) > 7 else 0


def memory(pid: int) -> Memory:
    status = _read_kib(f"/proc/{pid}/status", ("VmRSS:", "VmHWM:"))
    if status:
        rollup = _read_kib(
            f"/proc/{pid}/smaps_rollup", ("Pss:", "Private_Clean:", "Private_Dirty:")
        )
        pss = rollup.pop("Pss:", None)
        uss = sum(rollup.values()) if rollup else None
        return Memory(status.get("VmRSS:"), uss, pss, status.get("VmHWM:"))
    psutil = _psutil()
    if psutil is None:
        return Memory(None, None, None, None)
    try:
        info = psutil.Process(pid).memory_full_info()
        uss = int(getattr(info, "uss", 0)) or None
        return Memory(int(info.rss), uss, int(getattr(info, "pss", 0)) or None, None)
    except psutil.Error:
        return Memory(None, None, None, None)


def _read_kib(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """The given ``Key: N kB`` lines of a /proc file, in bytes (empty if unreadable)."""
    found: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in keys:
                    found[parts[0]] = int(parts[1]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def _psutil() -> Any:
    try:
        return importlib.import_module("psutil")  # optional: not a dependency
    except ImportError:
        return None
