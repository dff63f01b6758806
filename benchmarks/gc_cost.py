"""What Python's garbage collector costs a command: every collection of every process of its tree.

    python benchmarks/gc_cost.py -- .venv/bin/python -m beam_pipeline convert --input DIR --output_dir OUT
    python benchmarks/gc_cost.py -- .venv/bin/python benchmarks/scale.py --one 100000 --plan_only --result r.json
    python benchmarks/gc_cost.py --json out.json -- .venv/bin/python benchmarks/label_join.py --rows 1000000

The command runs with a `sitecustomize` module put first on PYTHONPATH (this file's
directory holds none: it is written to a temporary one), which adds a `gc.callbacks` hook
to every Python process of the tree, forked ones included (os.register_at_fork starts a
fresh tally in the child). The hook times each collection (perf_counter and the thread's
CPU clock, from "start" to "stop") and counts it by generation; each process writes its
tally to a file of its own, at exit and at least every 0.2 s while it collects (a forked
pool worker ends with os._exit, which runs no atexit hook: at most its last 0.2 s of
collections is lost). With GC_COST_SET in the environment ("off", or "T0,T1,T2"), every
process of the tree starts with collection off or those thresholds: an experiment, to see
what a setting would save before the product makes it. Printed per process (the runner;
the forked writers together): the collections of each generation, their seconds (wall and
CPU), the objects they freed, and the command's whole CPU time (wait4, the tree) for scale.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SITECUSTOMIZE = r"""
import atexit, gc, json, os, time

_DIR = os.environ.get("GC_COST_DIR")
if _DIR:
    _state = {}

    def _reset():
        _state.update(
            pid=os.getpid(), ppid=os.getppid(), argv=" ".join(__import__("sys").argv)[:200],
            count=[0, 0, 0], wall=[0.0, 0.0, 0.0], cpu=[0.0, 0.0, 0.0], collected=[0, 0, 0],
            flushed=time.perf_counter(), t0=0.0, c0=0.0, thresholds=list(gc.get_threshold()),
        )

    def _flush():
        _state["thresholds_at_end"] = list(gc.get_threshold())
        _state["frozen_at_end"] = gc.get_freeze_count()
        path = os.path.join(_DIR, "%d.json" % os.getpid())
        with open(path + ".tmp", "w") as f:
            json.dump({k: v for k, v in _state.items() if k not in ("t0", "c0", "flushed")}, f)
        os.replace(path + ".tmp", path)
        _state["flushed"] = time.perf_counter()

    def _hook(phase, info):
        if phase == "start":
            _state["t0"], _state["c0"] = time.perf_counter(), time.thread_time()
            return
        now = time.perf_counter()
        g = info["generation"]
        _state["count"][g] += 1
        _state["wall"][g] += now - _state["t0"]
        _state["cpu"][g] += time.thread_time() - _state["c0"]
        _state["collected"][g] += info["collected"]
        if now - _state["flushed"] > 0.2:
            _flush()

    _set = os.environ.get("GC_COST_SET")  # an experiment: "off", or thresholds "T0,T1,T2"
    if _set == "off":
        gc.disable()
    elif _set:
        gc.set_threshold(*map(int, _set.split(",")))
    _reset()
    gc.callbacks.append(_hook)
    os.register_at_fork(after_in_child=_reset)
    atexit.register(_flush)
"""


def run(cmd: list[str]) -> dict:
    """Runs `cmd` with the hook; returns the tree's CPU, wall and every process's tally."""
    with tempfile.TemporaryDirectory() as site, tempfile.TemporaryDirectory() as out:
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        env = dict(os.environ, GC_COST_DIR=out)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        procs = []
        for path in sorted(glob.glob(os.path.join(out, "*.json"))):
            with open(path) as f:
                procs.append(json.load(f))
    return {
        "cmd": cmd,
        "status": os.waitstatus_to_exitcode(status),
        "wall": wall,
        "tree_cpu": usage.ru_utime + usage.ru_stime,
        "max_rss_mb": usage.ru_maxrss / 1024,
        "processes": procs,
    }


def _row(name: str, tallies: list[dict]) -> str:
    count = [sum(t["count"][g] for t in tallies) for g in range(3)]
    wall = [sum(t["wall"][g] for t in tallies) for g in range(3)]
    cpu = [sum(t["cpu"][g] for t in tallies) for g in range(3)]
    freed = sum(sum(t["collected"]) for t in tallies)
    gens = "  ".join(f"gen{g} {count[g]:>6} {wall[g]:6.3f}s" for g in range(3))
    return f"{name:<10} {gens}  all {sum(wall):6.3f}s wall {sum(cpu):6.3f}s cpu  freed {freed:>9,}"


def report(result: dict) -> str:
    """The tallies, one line for the command's first process and one for all its children."""
    procs = result["processes"]
    root = [p for p in procs if p["ppid"] == os.getpid()]
    rest = [p for p in procs if p["ppid"] != os.getpid()]
    lines = [
        f"exit {result['status']}  wall {result['wall']:.2f} s  tree CPU {result['tree_cpu']:.2f} s  "
        f"max RSS {result['max_rss_mb']:.0f} MB  load {os.getloadavg()[0]:.2f}",
        _row("runner", root),
    ]
    if rest:
        lines.append(_row(f"{len(rest)} others", rest))
    if root:
        lines.append(
            f"runner thresholds at start {root[0]['thresholds']}, at end {root[0]['thresholds_at_end']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="Also write the tallies to this file.")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given")
    result = run(cmd)
    print(report(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["status"] == 0 else 1


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
