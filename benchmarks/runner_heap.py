"""Where the runner's bytes are: one `convert` in this process, its heap sampled at each new RSS high.

    python benchmarks/runner_heap.py INPUT_DIR [--images N] [--trace FRAMES] [-- extra convert flags]

Runs `beam_pipeline.main.run` in-process (the local FnApiRunner, default flags) while a
thread samples this process's RSS every 20 ms; after each new high (10 MB above the last
snapshot) the runner's own thread takes a snapshot of what the runner holds at its next
safe point (after a bundle, or while WriteShardFn waits for its writers), and at the end
the snapshots are printed, the one with the highest RSS in detail:

- the allocators: glibc malloc's arenas (in use and free inside them, `mallinfo2`) and
  CPython's small-object arenas (`sys._debugmallocstats`); memory freed into an arena but
  not given back to the kernel still counts in RSS;
- every in-memory buffer of the FnApiRunner (`ListBuffer`: a PCollection between two fused
  stages, as encoded bytes; `GroupingBuffer`: a GroupByKey's input, decoded, then its
  grouped output), named by PCollection (or by the stage that will consume it), with its
  size in bytes per listed image;
- the state servicer (side inputs, committed for the whole run);
- how many of our records are alive as Python objects (ImageFile, ImageRecord, and the
  records inside ShardTasks);
- RSS by fused stage: at its first bundle's start, its highest while its bundles ran, and
  at its end, for the stages that raised it most (the runner's peak is inside a stage: the
  stage's input and output are held as encoded bytes, as protobuf copies on the in-memory
  data plane, and as the bytes the SDK side reads, all at once).

Snapshots walk the collector's objects (a fraction of a second at 100,000 images) with
the runner paused, so the run is slower than a plain one. They are taken in the runner's
thread, never from another one: holding a reference to every object while a thread is
half-way through building a tuple or bytes object breaks it (a SystemError or a decode
error inside the pipeline). The RSS figures are this process only (the forked writers
are measured from outside by memory.py).
Linux and glibc only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc

from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
from apache_beam.runners.portability.fn_api_runner.translations import split_buffer_id

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


from beam_pipeline import main as convert_main  # noqa: E402
from transforms.records import ImageFile, ImageRecord, ShardTask  # noqa: E402
from transforms.writing import processes  # noqa: E402

MB = 2**20
STEP_BYTES = 10 * MB  # a snapshot at every new RSS high this much above the last one
LARGE = 64 * 1024  # RUNNER_MMAP_THRESHOLD: blocks from this size up are mapped apart
ARENA_BYTES = 2**20 if sys.version_info >= (3, 10) else 2**18  # pymalloc arena (64-bit)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def malloc_info() -> dict[str, float]:
    """glibc malloc, all arenas (MB): heap held, of it in use and free; mmapped chunks."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {
        "heap": m.arena / MB,
        "in_use": m.uordblks / MB,
        "free": m.fordblks / MB,
        "mmapped": m.hblkhd / MB,
    }


def pymalloc_arenas_mb() -> float:
    """CPython's small-object allocator: MB of arenas currently allocated (from _debugmallocstats)."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        if "arenas allocated current" in line:
            arenas = int(line.split("=")[-1].replace(",", ""))
            return arenas * ARENA_BYTES / MB
    return 0.0


def _buffer_size(buffer) -> tuple[int, int]:
    """(bytes, elements) of one runner buffer: encoded bytes, plus decoded keys/values count."""
    size = count = 0
    if isinstance(buffer, execution.ListBuffer):
        size, count = sum(len(b) for b in buffer._inputs), len(buffer._inputs)
    elif isinstance(buffer, execution.GroupingBuffer):
        size = sum(len(k) for k in buffer._table)
        count = sum(len(v) for v in buffer._table.values())
    grouped = getattr(buffer, "_grouped_output", None) or []
    size += sum(len(b) for part in grouped for b in part)
    return size, count


def _large_blocks(objects: list) -> list[tuple[int, str]]:
    """Objects of at least LARGE bytes (what glibc maps on its own): containers, and the bytes
    objects they hold (bytes are not tracked by the collector), each once, by owner type."""
    seen: set[int] = set()
    found: collections.Counter = collections.Counter()
    for o in objects:
        size = sys.getsizeof(o)
        if size >= LARGE and id(o) not in seen:
            seen.add(id(o))
            found[type(o).__name__] += size
        for r in gc.get_referents(o):
            if isinstance(r, (bytes, bytearray)) and len(r) >= LARGE and id(r) not in seen:
                seen.add(id(r))
                found[f"{type(r).__name__} in {type(o).__name__}"] += len(r)
    return [(size, name) for name, size in found.most_common(8)]


def _buffer_names(contexts: list) -> dict[int, str]:
    names: dict[int, str] = {}
    for ctx in contexts:
        pcolls = ctx.pipeline_components.pcollections
        for buffer_id, buffer in ctx.pcoll_buffers.items():
            _, pcoll = split_buffer_id(buffer_id)
            names[id(buffer)] = pcolls[pcoll].unique_name if pcoll in pcolls else buffer_id.decode()
        queues = ctx.queues
        for queue in (queues.ready_inputs, queues.watermark_pending_inputs, queues.time_pending_inputs):
            for key, data_input in list(queue._q):
                stage = key[0] if isinstance(key, tuple) else key
                for buffer in data_input.data.values():
                    names.setdefault(id(buffer), f"input of stage {stage}")
    return names


def snapshot() -> dict:
    """What the runner holds right now (see the module docstring)."""
    # No other thread (the writers' queue threads) may run while we hold every object: a
    # tuple another thread is still building must not gain a reference. The long switch
    # interval keeps the GIL here until the list is dropped (nothing below blocks).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        found = _walk_objects()
    finally:
        sys.setswitchinterval(interval)
    return {"rss": rss_bytes() / MB, "malloc": malloc_info(), "pymalloc": pymalloc_arenas_mb(), **found}


def _walk_objects() -> dict:
    objects = gc.get_objects()
    contexts = [o for o in objects if isinstance(o, execution.FnApiRunnerExecutionContext)]
    names = _buffer_names(contexts)
    buffers = []
    for o in objects:
        if isinstance(o, (execution.ListBuffer, execution.GroupingBuffer)):
            size, count = _buffer_size(o)
            if size:
                buffers.append((size, count, type(o).__name__, names.get(id(o), "(not named: in a bundle)")))
    state = 0
    for ctx in contexts:
        state += sum(len(b) for values in ctx.state_servicer._state.values() for b in values)
    types = collections.Counter(type(o) for o in objects)
    in_tasks = sum(len(o) for o in objects if isinstance(o, ShardTask))
    large = _large_blocks(objects)
    count = len(objects)
    del objects, contexts
    return {
        "buffers": sorted(buffers, reverse=True),
        "state": state / MB,
        "records": {
            "ImageFile": types[ImageFile],
            "ImageRecord": types[ImageRecord],
            "in ShardTasks": in_tasks,
        },
        "objects": count,
        "large": large,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--images", type=int, default=0, help="Images listed (for bytes per image).")
    parser.add_argument("--output_dir", default="")
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        help="Also trace Python's allocations (tracemalloc, this many frames; slow): the largest "
        "allocation sites at the highest snapshot are printed.",
    )
    args, flags = parser.parse_known_args(argv)  # the rest (after --): extra convert flags
    flags = [f for f in flags if f != "--"]
    traced: list = [0, None]  # RSS and tracemalloc snapshot of the highest snapshot
    out = args.output_dir or tempfile.mkdtemp(prefix="runner-heap-")
    shutil.rmtree(out, ignore_errors=True)
    snaps: list[tuple[float, dict]] = []
    wanted, done = threading.Event(), threading.Event()
    start = time.perf_counter()

    def sample() -> None:  # RSS only: the objects are walked by the runner's thread
        last = rss_bytes()
        while not done.wait(0.02):
            now = rss_bytes()
            _STAGES.peak(now)
            if now >= last + STEP_BYTES:
                last = now
                wanted.set()

    def at_safe_point() -> None:
        if wanted.is_set() or not snaps:  # and one after the first bundle, whatever the RSS
            wanted.clear()
            snaps.append((time.perf_counter() - start, snapshot()))
            if args.trace and snaps[-1][1]["rss"] > traced[0]:
                traced[:] = [snaps[-1][1]["rss"], tracemalloc.take_snapshot()]

    base = snapshot()
    if args.trace:
        tracemalloc.start(args.trace)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with _safe_points(at_safe_point):
        convert_main.run(
            ["--input", args.input, "--output_dir", out, "--quiet", *flags], save_main_session=False
        )
    done.set()
    thread.join()
    shutil.rmtree(out, ignore_errors=True)
    _report(base, snaps, args.images)
    _STAGES.report()
    if traced[1] is not None:
        print(f"\nPython's allocations alive at the highest traced snapshot (RSS {traced[0]:.0f} MB):")
        stats = traced[1].statistics("traceback")
        print(f"  {sum(s.size for s in stats) / MB:.1f} MB traced in all")
        for stat in stats[:12]:
            where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in stat.traceback)
            print(f"  {stat.size / MB:7.1f} MB {stat.count:8d} blocks  {where}")
    return 0


class _StageRss:
    """RSS (bytes) per fused stage: [at its start, highest while it ran, at its end]."""

    def __init__(self) -> None:
        self.rss: dict[str, list[int]] = {}
        self._current: list[int] | None = None

    def enter(self, stage: str) -> None:
        now = rss_bytes()
        self._current = self.rss.setdefault(stage, [now, now, now])
        self._current[1] = max(self._current[1], now)

    def peak(self, now: int) -> None:
        current = self._current  # read once: the runner's thread may swap it
        if current is not None and now > current[1]:
            current[1] = now

    def leave(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current[2] = rss_bytes()
            current[1] = max(current[1], current[2])

    def report(self, top: int = 6) -> None:
        print(f"\nRSS by fused stage (MB; the {top} that rose most above their start; start peak end):")
        rises = sorted(self.rss.items(), key=lambda kv: kv[1][1] - kv[1][0], reverse=True)
        for stage, (start, peak, end) in rises[:top]:
            steps = [
                part.replace("ref_AppliedPTransform_", "").strip("()+")
                for part in stage.split(")+(")
                if "/" in part or "ref_AppliedPTransform_" in part
            ]
            name = " + ".join(step for step in steps if step)
            print(f"  {start / MB:6.0f} {peak / MB:6.0f} {end / MB:6.0f}  {name[:110]}")


_STAGES = _StageRss()


@contextlib.contextmanager
def _safe_points(hook):
    """Calls `hook()` in the runner's thread after every bundle and before every wait for the writers."""
    execute = fn_runner.FnApiRunner._execute_bundle
    real_futures = processes.futures

    def execute_bundle(self, context, bundle_context, *a, **k):
        _STAGES.enter(bundle_context.stage.name)
        try:
            return execute(self, context, bundle_context, *a, **k)
        finally:
            _STAGES.leave()
            hook()

    class _Futures:
        def __getattr__(self, name):
            return getattr(real_futures, name)

        def wait(self, *a, **k):
            hook()
            return real_futures.wait(*a, **k)

    fn_runner.FnApiRunner._execute_bundle = execute_bundle
    processes.futures = _Futures()
    try:
        yield
    finally:
        fn_runner.FnApiRunner._execute_bundle = execute
        processes.futures = real_futures


def _report(base: dict, snaps: list[tuple[float, dict]], images: int) -> None:
    def line(t: str, s: dict) -> str:
        m = s["malloc"]
        r = s["records"]
        return (
            f"{t:>7} {s['rss']:6.0f} {m['in_use']:7.0f} {m['free']:6.0f} {m['mmapped']:6.0f} {s['pymalloc']:6.0f}"
            f" {sum(b[0] for b in s['buffers']) / MB:7.1f} {s['state']:6.1f}"
            f" {r['ImageFile']:8d} {r['ImageRecord']:8d} {r['in ShardTasks']:8d}"
        )

    print("MB of this process (the runner); malloc in use/free: glibc arenas; pymalloc: CPython's arenas")
    print(
        f"{'t s':>7} {'RSS':>6} {'malloc':>7} {'free':>6} {'mmap':>6} {'pymal':>6} {'buffers':>7} {'state':>6}"
        f" {'ImgFile':>8} {'ImgRec':>8} {'in tasks':>8}"
    )
    print(line("start", base))
    for t, s in snaps:
        print(line(f"{t:.1f}", s))
    if not snaps:
        return
    t, peak = max(snaps, key=lambda ts: ts[1]["rss"])
    t_buffers, most = max(snaps, key=lambda ts: sum(b[0] for b in ts[1]["buffers"]))
    shown = [("the highest RSS", t, peak)]
    if most is not peak:
        shown.append(("the most bytes in buffers", t_buffers, most))
    for what, when, snap in shown:
        print(f"\nrunner buffers at {what} ({snap['rss']:.0f} MB, t={when:.1f} s):")
        for size, count, kind, name in [b for b in snap["buffers"] if b[0] >= 1024][:15]:
            per = f"{size / images:7.0f} B/image" if images else ""
            print(f"  {size / MB:7.1f} MB {count:7d} el. {per} {kind:14} {name[:100]}")
        print("  large objects (>= 64 KB), by type (bytes: by the type holding them):")
        for size, name in snap["large"]:
            print(f"  {size / MB:7.1f} MB {name}")
    grown = peak["rss"] - base["rss"]
    if images:
        print(f"RSS grown since the start: {grown:.0f} MB = {grown * MB / images:.0f} B/image")


if __name__ == "__main__":
    sys.exit(main())
