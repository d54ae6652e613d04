"""How many CPU cores this process may use, and how many of them other processes keep busy: the
default parallelism of `taperlm compare` (never more workers x threads than idle cores). No torch.

- usable: the CPUs of this process's affinity mask, capped by a cgroup CPU quota (containers,
  `docker --cpus`, Slurm), rounded down but at least 1;
- busy: the CPU time other processes used during a short sample (Linux: /proc/stat over the CPUs
  of the affinity mask, or the cgroup's own usage when it has a quota; our own use subtracted),
  the least of a few consecutive sub-samples, so that a blip (a shell command, a process
  exiting) does not count as a job; else the 1-minute load average;
- idle: usable minus the CPUs other processes keep at least 3/4 busy (`TAKEN_FROM`): a core that
  another job uses a little still runs a single-threaded cell at nearly full speed, while one it
  keeps busy would make two cells share it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path


def _cgroup_quota() -> float | None:
    """CPUs allowed by a cgroup quota (v2 cpu.max or v1 cfs_quota/period), None when unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cpus(
    affinity: Callable[[], set[int] | None] = _affinity,
    cgroup_quota: Callable[[], float | None] = _cgroup_quota,
) -> int:
    """CPUs this process may run on: its affinity mask capped by the cgroup quota (>= 1). The
    probes default to this machine's; a caller (a test) may stand in for another machine."""
    mine = affinity()
    n = len(mine) if mine else (os.cpu_count() or 1)
    quota = cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def _busy_seconds() -> float | None:
    """CPU-seconds spent so far by everything that competes with us: the processes of our cgroup
    when it has a CPU quota (its cpu.stat), else all processes on the CPUs of our affinity mask
    (/proc/stat); None when neither is readable (not Linux)."""
    if _cgroup_quota() is not None:
        try:
            for line in Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = _affinity()
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        if mine is not None and int(name[3:]) not in mine:
            continue
        values = [int(x) for x in fields[:8]]  # guest time is already in user/nice
        ticks += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # - idle, iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU-seconds used by this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


SAMPLE_S = 1.2  # how long the default looks at the machine, in SAMPLES consecutive parts
SAMPLES = 3
TAKEN_FROM = 0.75  # a CPU other processes keep at least this busy is not idle


def busy_cpus(
    sample_s: float = SAMPLE_S,
    samples: int = SAMPLES,
    *,
    busy_seconds: Callable[[], float | None] = _busy_seconds,
    own_seconds: Callable[[], float] = _own_seconds,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """How many CPUs other processes keep busy now: their CPU time (minus our own) over each of
    `samples` consecutive parts of `sample_s` seconds, the least of them (a steady job shows in
    every part, a blip in one); else the 1-minute load average (0.0 when unknown). The probes,
    the clock and the sleep default to the real ones; a caller (a test) may pass its own."""
    rates = []
    start, own_start = busy_seconds(), own_seconds()
    t0 = clock()
    for _ in range(samples if start is not None and sample_s > 0 else 0):
        sleep(sample_s / samples)
        end, own_end, t1 = busy_seconds(), own_seconds(), clock()
        if end is None or t1 <= t0:
            break
        rates.append(max(0.0, ((end - start) - (own_end - own_start)) / (t1 - t0)))
        start, own_start, t0 = end, own_end, t1
    if rates:
        return min(rates)
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def taken_cpus(busy: float) -> int:
    """CPUs that `busy` CPUs of other processes' load take away (each kept >= TAKEN_FROM busy)."""
    return math.floor(busy + 1.0 - TAKEN_FROM)


def idle_cpus(
    sample_s: float = SAMPLE_S,
    usable_cpus: Callable[[], int] = usable_cpus,
    busy_cpus: Callable[[float], float] = busy_cpus,
) -> tuple[int, int, float]:
    """(idle, usable, busy): usable CPUs minus those other processes keep busy, >= 1 (the two
    counts default to this machine's; a caller may pass another's)."""
    usable = usable_cpus()
    busy = busy_cpus(sample_s)
    return max(1, usable - taken_cpus(busy)), usable, busy
