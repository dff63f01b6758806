"""Runs one command and measures it: wall time, CPU time and peak RSS of its process tree.

Peak RSS is sampled from /proc every 20 ms: the process's resident set plus the private
memory of its descendants (so worker subprocesses count; forked workers share the parent's
pages copy-on-write, and summing their RSS would count those pages once per worker), and
combined with the kernel's own high-water mark (`ru_maxrss`). With `per_process`, each
process's own peaks (RSS, PSS and USS from /proc/<pid>/smaps_rollup) and the tree's peak PSS
are sampled too (PSS shares each shared page among the processes that map it, so the tree's
PSS sum counts it once; summing RSS would count it once per process). CPU time is user + system from `wait4`, which includes the
descendants the process waited for. Run-queue wait (time a thread was ready but had no
core, from /proc/.../schedstat, sampled with the RSS) gives the CPU demand, which unlike
CPU % does not fall when other processes load the machine. Linux only, standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True)
class ProcessPeak:
    """One process of the tree: its highest RSS, PSS and USS (private pages) in MB.

    `started_s` is when the sampler first saw it (seconds after the start), `root` marks the
    measured command itself (the others are its descendants, e.g. forked writers).
    """

    pid: int
    root: bool
    started_s: float
    rss_mb: float = 0.0
    pss_mb: float = 0.0
    uss_mb: float = 0.0


@dataclasses.dataclass(frozen=True)
class Measurement:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    queued_s: float = 0.0
    peak_pss_mb: float = 0.0  # with per_process: the tree's PSS sum at its highest
    processes: tuple[ProcessPeak, ...] = ()  # with per_process: each process's own peaks

    @property
    def demand_percent(self) -> float:
        """(CPU time + time spent runnable but waiting for a core) / wall.

        An estimate of what the tool would use of the machine alone: on a busy machine
        CPU % drops because other processes hold the cores, this does not. It reads high
        for threads that take turns on the GIL (each wake-up queues for a core).
        200% = two cores' worth.
        """
        return 100.0 * (self.cpu_s + self.queued_s) / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_percent(self) -> float:
        """CPU time over wall time: 200% means two cores busy the whole run."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s else 0.0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(pid: int) -> list[int]:
    kids = _children()
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(kids.get(p, ()))
    return found


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _private_bytes(pid: int) -> int:
    """Pages of `pid` no other process maps (copy-on-write pages it has not touched are not)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in (b"Private_Clean", b"Private_Dirty"))
    except (OSError, KeyError, ValueError):
        return _rss_bytes(pid)


def smaps_rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and Uss (Private_Clean + Private_Dirty) of `pid` in bytes, from /proc."""
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    kb = {k.decode(): int(v.split()[0]) * 1024 for k, v in fields.items() if v.strip().endswith(b"kB")}
    return {"rss": kb["Rss"], "pss": kb["Pss"], "uss": kb["Private_Clean"] + kb["Private_Dirty"]}


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of `pid` plus the private bytes of all its descendants right now."""
    total = 0
    for p in _tree(pid):
        try:
            total += _rss_bytes(p) if p == pid else _private_bytes(p)
        except OSError:
            pass
    return total


def _queued_ns(pids: list[int], seen: dict[tuple[int, int], int]) -> None:
    """Records each thread's run-queue wait (ns) from /proc/<pid>/task/<tid>/schedstat."""
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat", "rb") as f:
                    seen[(p, int(tid))] = int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                pass


class _ProcessSampler:
    """Per-process peaks and the tree's peak PSS (run_measured's `per_process`)."""

    def __init__(self, root: int, start: float):
        self.root, self.start = root, start
        self.peaks: dict[int, dict[str, float]] = {}
        self.tree_pss = 0

    def sample(self, pids: list[int]) -> int:
        """Samples every process in `pids`; returns the tree's RSS (root RSS + others' USS)."""
        pss = rss = 0
        for p in pids:
            try:
                now = smaps_rollup(p)
            except (OSError, KeyError, ValueError):
                continue
            peak = self.peaks.setdefault(p, {"started_s": time.perf_counter() - self.start})
            for k, v in now.items():
                peak[k] = max(peak.get(k, 0), v)
            pss += now["pss"]
            rss += now["rss"] if p == self.root else now["uss"]
        self.tree_pss = max(self.tree_pss, pss)
        return rss

    def result(self) -> tuple[ProcessPeak, ...]:
        mb = 2**20
        return tuple(
            ProcessPeak(
                p,
                p == self.root,
                v["started_s"],
                v.get("rss", 0) / mb,
                v.get("pss", 0) / mb,
                v.get("uss", 0) / mb,
            )
            for p, v in sorted(self.peaks.items(), key=lambda kv: (kv[0] != self.root, kv[1]["started_s"]))
        )


def run_measured(
    cmd: list[str], *, env: dict | None = None, log_path: str | None = None, per_process: bool = False
) -> Measurement:
    """Runs `cmd` to completion (output to `log_path` or discarded) and measures it.

    `per_process` also samples each process's RSS, PSS and USS (smaps_rollup, a little more
    work for the sampler than statm: for memory benchmarks, not CPU ones).
    """
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    peak = 0
    queued: dict[tuple[int, int], int] = {}
    done = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    processes = _ProcessSampler(proc.pid, start) if per_process else None

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            pids = _tree(proc.pid)
            peak = max(peak, processes.sample(pids) if processes else tree_rss_bytes(proc.pid))
            _queued_ns(pids, queued)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if log_path:
        out.close()
    peak = max(peak, usage.ru_maxrss * 1024)
    return Measurement(
        wall,
        usage.ru_utime + usage.ru_stime,
        peak / 2**20,
        proc.returncode,
        sum(queued.values()) / 1e9,
        processes.tree_pss / 2**20 if processes else 0.0,
        processes.result() if processes else (),
    )


def aligned(lines: list[tuple[str, ...]]) -> str:
    """Rows as a text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        line[0].ljust(widths[0]) + "  " + "  ".join(c.rjust(w) for c, w in zip(line[1:], widths[1:]))
        for line in lines
    )
