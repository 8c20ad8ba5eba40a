"""What the figures were measured on: they mean little without it."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import postroom

__all__ = ["filesystem", "load_average", "summary"]

#: File systems that keep data in memory: an fsync there costs nothing, so neither does a
#: "durable" commit, and every ratio to the raw loop would be meaningless.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def summary(folder: Path) -> dict[str, Any]:
    """CPUs, versions and the file system the databases live on."""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postroom": postroom.__version__,
        "commit": _git_commit(),
        "folder": str(folder),
        "filesystem": filesystem(folder),
        # glibc returns freed heap to the kernel past a threshold; on a VM where page
        # faults are dear, a process whose heap keeps crossing it runs measurably slower.
        "malloc_env": {name: value for name, value in sorted(os.environ.items())
                       if name.startswith("MALLOC_")},
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (other processes compete for the CPUs and disk)."""
    return [round(value, 2) for value in os.getloadavg()]


def filesystem(path: Path) -> str:
    """The type of the file system holding ``path`` (Linux ``/proc/mounts``), or "unknown"."""
    try:
        mounts = Path("/proc/mounts").read_text("utf-8").splitlines()
    except OSError:
        return "unknown"
    resolved = str(path.resolve())
    best, kind = "", "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text("utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    """The checkout's commit (``-dirty`` if it has changes), or None outside a checkout."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=False, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None
