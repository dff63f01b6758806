"""`img2tfrecord inspect OUTPUT_DIR [--report report.html]`: what is in a converted dataset.

Reads every record (with verify's checks) and failures.jsonl; prints records and bytes per
split and class, image formats and sizes, and failures by reason; for a dataset with objects
(boxes, masks, class maps: --schema odapi or tfds), the objects per split and class, their COCO
sizes and the images without objects. `--report` writes one self-contained HTML page (SVG bars,
the failures, samples per class as data URIs; with objects, samples per object class with their
boxes, class names, masks and class map drawn over them).
Memory: counters per class, format, size bucket, object class and size and failure reason,
`--samples` images a class, `--failures` examples a reason.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import html
import io
import json
import sys
import unicodedata
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.readers.drawing import OBJECT_THUMBNAIL_PX, objects_svg, thumbnail
from beam_pipeline.readers.verify import (
    CommandParser,
    list_shards,
    load_class_names,
    load_format,
    load_summary,
)
from transforms.failures import reason_kind
from transforms.output.publish import FAILURES_FILE
from transforms.paths import normalize_root
from transforms.verify.shards import OBJECT_SIZES, ShardCheck, bucket_sides, check_shard

DEFAULT_SAMPLES = 8
DEFAULT_FAILURE_EXAMPLES = 10
THUMBNAIL_PX = 128
NO_OBJECTS = "(no objects)"  # the heading of the samples without objects
SIZE_NAMES = tuple(name for name, _ in OBJECT_SIZES)


@dataclasses.dataclass
class FailureStats:
    """failures.jsonl in brief: the count, per reason kind, and the first examples of each."""

    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)  # (path, reason)

    @property
    def total(self) -> int:
        return self.kinds.total()

    def add(self, path: str, reason: str, keep: int) -> None:
        kind = reason_kind(reason)
        self.kinds[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < keep:
            shown.append((path, reason))

    def by_count(self) -> list[tuple[str, int]]:
        return sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0]))


def read_failures(output_dir: str, keep: int = DEFAULT_FAILURE_EXAMPLES) -> FailureStats:
    """Counts failures.jsonl of `output_dir` line by line (a missing file counts nothing)."""
    stats = FailureStats()
    path = FileSystems.join(output_dir, FAILURES_FILE)
    if not FileSystems.exists(path):
        return stats
    with FileSystems.open(path) as f:
        for line in iter(f.readline, b""):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                stats.add(str(entry.get("path", "?")), str(entry.get("reason", "?")), keep)
            except (ValueError, AttributeError):
                stats.add("?", "unreadable line in failures.jsonl", keep)
    return stats


@dataclasses.dataclass
class ClassStats:
    records: int = 0
    bytes: int = 0


@dataclasses.dataclass
class DatasetStats:
    """Counts and sizes read from the records, and sample images per class."""

    splits: dict[str, dict[str, ClassStats]] = dataclasses.field(default_factory=dict)  # split -> class
    # class key -> [(encoded image, file name, split)]
    samples: dict[str, list] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    bad: list[ShardCheck] = dataclasses.field(default_factory=list)
    formats: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    widths: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # bucket -> n
    heights: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failures: FailureStats = dataclasses.field(default_factory=FailureStats)
    bad_splits: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # split -> n
    # With objects (else None): split -> object class -> Counter of COCO size -> objects, classes
    # in the class index's order; and split -> records without objects.
    objects: dict[str, dict[str, collections.Counter]] | None = None
    background: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    class_names: list[str] = dataclasses.field(default_factory=list)

    def split_total(self, split: str) -> ClassStats:
        classes = self.splits[split].values()
        return ClassStats(sum(c.records for c in classes), sum(c.bytes for c in classes))

    @property
    def image_labels(self) -> bool:
        """False for a dataset of objects whose images carry no class label of their own (TFDS's
        and the OD API's detection data): its per-class rows would be one blank class."""
        return self.objects is None or any(key for classes in self.splits.values() for key in classes)

    def object_sizes(self, split: str) -> collections.Counter:
        """The split's objects by COCO size."""
        return sum(self.objects[split].values(), collections.Counter())


def collect_stats(
    output_dir: str,
    samples_per_class: int = DEFAULT_SAMPLES,
    failure_examples: int = DEFAULT_FAILURE_EXAMPLES,
) -> DatasetStats:
    """Reads every shard and failures.jsonl of `output_dir`. Raises UserError if it is not a dataset."""
    output_dir = normalize_root(output_dir)
    summary = load_summary(output_dir)
    fmt = load_format(output_dir, summary)
    names, offset = load_class_names(output_dir), summary.get("label_offset", 0)
    stats = DatasetStats(failures=read_failures(output_dir, failure_examples), class_names=list(names))
    has_objects = bool(fmt.schema.object_roles)
    if has_objects:
        stats.objects = {}
    for split, paths in list_shards(output_dir).items():
        classes: dict[str, ClassStats] = collections.defaultdict(ClassStats)
        objects: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for path in paths:
            check = check_shard(path, fmt, names, offset, samples_per_class=samples_per_class)
            if not check.ok:
                stats.bad.append(check)
                stats.bad_splits[split] += 1
            for key, n, size in check.classes:
                classes[key].records += n
                classes[key].bytes += size
            for key, data, name, drawn in check.samples:
                keep_sample(stats.samples[key], (data, name, split, drawn), samples_per_class)
            stats.formats.update(dict(check.formats))
            stats.widths.update(dict(check.widths))
            stats.heights.update(dict(check.heights))
            for cls, size, n in check.objects:
                objects[cls][size] += n
            stats.background[split] += check.background
        stats.splits[split] = dict(sorted(classes.items(), key=lambda kv: class_order(kv[0])))
        if has_objects:
            index = {name: i for i, name in enumerate(names)}
            stats.objects[split] = dict(sorted(objects.items(), key=lambda kv: index[kv[0]]))
    return stats


def class_order(key: str) -> tuple:
    """The sort key of a class key: integer class names in numeric order (7 before 42 before
    9999), before other names in text order; a multi-label key ('1|7') part by part."""
    return tuple((0, int(part), part) if part.isdigit() else (1, 0, part) for part in key.split("|"))


# Scripts that name a language well enough for the page's `lang` (fonts, screen readers):
# Unicode character names start with these. Latin or Han alone name no one language.
_SCRIPT_LANGS = (("HIRAGANA", "ja"), ("KATAKANA", "ja"), ("HANGUL", "ko"))


def page_lang(names: Iterable[str]) -> str | None:
    """The report's `lang`: the language the class names' script tells (kana: 'ja', Hangul:
    'ko'), or None when it tells none (then the page says nothing rather than a wrong 'en')."""
    found = set()
    for name in names:
        for char in name:
            if ord(char) > 0x2E7F:  # below it no script of _SCRIPT_LANGS
                found.update(
                    lang for prefix, lang in _SCRIPT_LANGS if unicodedata.name(char, "").startswith(prefix)
                )
    return "ja" if "ja" in found else found.pop() if len(found) == 1 else None


def keep_sample(kept: list[tuple], sample: tuple, limit: int) -> None:
    """Keeps at most `limit` samples (data, name, split, ...) of one class, spread over the splits
    as evenly as they come: a sample of a split with fewer kept replaces the last one of the split
    with the most."""
    if len(kept) < limit:
        kept.append(sample)
        return
    counts = collections.Counter(s[2] for s in kept)
    split, most = counts.most_common(1)[0]
    if most > counts[sample[2]] + 1:
        kept[max(i for i, s in enumerate(kept) if s[2] == split)] = sample


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def display_width(text: str) -> int:
    """Terminal columns of `text`: wide and full-width characters (CJK, Hangul) take two."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text
    )


def pad(text: str, width: int) -> str:
    """`text` left-aligned in `width` terminal columns."""
    return text + " " * max(0, width - display_width(text))


def distribution(counter: collections.Counter, label=str) -> str:
    """'a: 3, b: 2' for a Counter, by key order."""
    return ", ".join(f"{label(k)}: {n:,}" for k, n in sorted(counter.items()))


def size_label(bucket: int) -> str:
    """A size bucket (transforms.verify.shards.size_bucket) as the range of sides it holds: '97-112'."""
    return "-".join(map(str, bucket_sides(bucket)))


def format_table(stats: DatasetStats) -> str:
    """The plain-text report printed by `inspect`."""
    # A damaged shard first: the counts below miss what it holds past the damage.
    lines = [f"BAD SHARD {c.path}: offset {c.offset}: {c.error}" for c in stats.bad]
    width = max([display_width(k) for c in stats.splits.values() for k in c] + [5])
    for split, classes in stats.splits.items():
        total = stats.split_total(split)
        bad = stats.bad_splits[split]
        at_least, damaged = ("at least ", f" ({bad} bad shard{'s' if bad > 1 else ''})") if bad else ("", "")
        lines.append(f"{split}: {at_least}{total.records:,} records, {human_bytes(total.bytes)}{damaged}")
        for key, c in classes.items() if stats.image_labels else ():
            mean = human_bytes(c.bytes / c.records) if c.records else "-"
            lines.append(f"  {pad(key, width)}  {c.records:>8,}  {human_bytes(c.bytes):>10}  (mean {mean})")
    if stats.formats:
        lines.append(f"formats: {distribution(stats.formats)}")
    if stats.widths:
        lines.append(f"widths (px): {distribution(stats.widths, size_label)}")
    if stats.heights:
        lines.append(f"heights (px): {distribution(stats.heights, size_label)}")
    if stats.objects is not None:
        lines += _object_lines(stats)
    failures = stats.failures
    if failures.total:
        reasons = "; ".join(f"{n:,} × {kind}" for kind, n in failures.by_count()[:5])
        lines.append(f"failed: {failures.total:,} images not written ({FAILURES_FILE}): {reasons}")
    else:
        lines.append("failed: none")
    return "\n".join(lines)


def _object_lines(stats: DatasetStats) -> list[str]:
    """The objects of each split: the count, COCO sizes and images without objects, then the
    objects per class (aligned as the class rows above)."""
    names = [c for classes in stats.objects.values() for c in classes]
    width = max(
        [display_width(k) for c in stats.splits.values() for k in c] + [5] + list(map(display_width, names))
    )
    lines = []
    for split, classes in stats.objects.items():
        sizes = stats.object_sizes(split)
        shown = ", ".join(f"{sizes[name]:,} {name}" for name in SIZE_NAMES)
        records = stats.split_total(split).records
        background = stats.background[split]
        lines.append(
            f"objects in {split}: {sizes.total():,} (COCO sizes: {shown}); "
            f"{background:,} of {records:,} images without objects"
        )
        for name, counts in classes.items():
            lines.append(f"  {pad(name, width)}  {counts.total():>8,}")
    return lines


def thumbnail_png(data: bytes, size: int = THUMBNAIL_PX) -> tuple[bytes, tuple[int, int]]:
    """A PNG thumbnail (longest side `size`, first frame) of an encoded image, and its (width, height)."""
    frame, original = thumbnail(data, size)
    out = io.BytesIO()
    frame.save(out, format="PNG")
    return out.getvalue(), original


def _bars_svg(
    counts: dict[str, int], label: str, label_w: int = 220, chart_w: int = 480, fluid: bool = False
) -> str:
    """Horizontal bars with their counts (inline SVG), one per key in the given order.
    `fluid`: the chart scales to the width of its box."""
    bar_h = 22
    top = max(list(counts.values()) + [1])
    rows = []
    for i, (key, n) in enumerate(counts.items()):
        y = i * bar_h
        w = max(1, round(chart_w * n / top))
        name = html.escape(key or "(unlabelled)")
        rows.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{name}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w}" height="{bar_h - 6}" fill="#4a7bd0">'
            f"<title>{name}: {n}</title></rect>"
            f'<text x="{label_w + w + 6}" y="{y + 15}">{n:,}</text>'
        )
    width, height = label_w + chart_w + 80, bar_h * max(1, len(counts))
    size = f'viewBox="0 0 {width} {height}" width="100%"' if fluid else f'width="{width}" height="{height}"'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{html.escape(label)}" '
        f'{size} font-family="sans-serif" font-size="13">' + "".join(rows) + "</svg>"
    )


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
    "td,th{padding:2px 10px;text-align:right}td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}"
    ".bad{color:#b00}.sheet{display:flex;flex-wrap:wrap;gap:8px}"
    "figure{margin:0;width:140px;text-align:center}figure img{border:1px solid #ccc;max-width:128px}"
    "figcaption{font-size:11px;color:#444;overflow-wrap:anywhere}"
    ".failures td{text-align:left;font-family:monospace;font-size:12px}"
    # The three image charts: one row of three columns that scale with the page (never wrapped).
    ".dist{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:2em;align-items:start}"
)
# Added to the page of a dataset with objects: its larger samples with the boxes drawn.
_OBJECT_STYLE = "figure.objects{width:auto;max-width:270px}svg.objects{border:1px solid #ccc}"


def _failures_html(failures: FailureStats) -> list[str]:
    e = html.escape
    if not failures.total:
        return ["<h2>Failures</h2><p>No image failed.</p>"]
    parts = [
        f"<h2>Failures</h2><p>{failures.total:,} images were not written; every one is in "
        f"<code>{FAILURES_FILE}</code>. The first of each reason:</p>",
        '<table class="failures">',
    ]
    for kind, n in failures.by_count():
        shown = failures.examples.get(kind, [])
        parts.append(f'<tr><th colspan="2" style="text-align:left">{e(kind)} ({n:,})</th></tr>')
        parts += [f"<tr><td>{e(path)}</td><td>{e(reason)}</td></tr>" for path, reason in shown]
        if n > len(shown):
            parts.append(f"<tr><td>... and {n - len(shown):,} more</td><td></td></tr>")
    parts.append("</table>")
    return parts


def _caption(name: str, split: str, size: tuple[int, int], nbytes: int, objects: int | None = None) -> str:
    base = name.rsplit("/", 1)[-1] if name else ""
    count = None if objects is None else f"{objects} object{'' if objects == 1 else 's'}"
    bits = [b for b in (base, split, f"{size[0]}×{size[1]}", human_bytes(nbytes), count) if b]
    title = html.escape(name or base, quote=True)
    return f'<figcaption title="{title}">{html.escape(" · ".join(bits))}</figcaption>'


def render_report(stats: DatasetStats, title: str) -> str:
    """The self-contained HTML page (no external resources)."""
    e = html.escape
    records = sum(stats.split_total(s).records for s in stats.splits)
    classes = sorted({key for classes in stats.splits.values() for key in classes}, key=class_order)
    lang = page_lang(classes)
    lang_attr = f' lang="{lang}"' if lang else ""  # no language rather than a wrong one
    parts = [
        "<!DOCTYPE html>",
        f'<html{lang_attr}><head><meta charset="utf-8">',
        f"<title>{e(title)}</title>",
        f"<style>{_STYLE}{'' if stats.objects is None else _OBJECT_STYLE}</style>",
        "</head><body>",
        f"<h1>{e(title)}</h1>",
        f"<p>{records:,} records in {len(stats.splits)} split(s); {stats.failures.total:,} images failed.</p>",
    ]
    for check in stats.bad:
        parts.append(
            f'<p class="bad">Bad shard {e(check.path)}: offset {check.offset}: {e(check.error or "")}</p>'
        )
    parts.append("<h2>Splits</h2><table><tr><th>split</th><th>class</th><th>records</th><th>bytes</th></tr>")
    for split, classes in stats.splits.items():
        total = stats.split_total(split)
        parts.append(
            f"<tr><th>{e(split)}</th><th>all</th><th>{total.records}</th><th>{human_bytes(total.bytes)}</th></tr>"
        )
        for key, c in classes.items() if stats.image_labels else ():
            parts.append(
                f"<tr><td></td><td>{e(key)}</td><td>{c.records}</td><td>{human_bytes(c.bytes)}</td></tr>"
            )
    parts.append("</table><h2>Classes per split</h2>" if stats.image_labels else "</table>")
    if stats.image_labels:
        for split, classes in stats.splits.items():
            counts = {key: c.records for key, c in classes.items()}
            parts += [f"<h3>{e(split)}</h3>", _bars_svg(counts, f"classes of {split}")]
    if stats.objects is not None:
        parts += _objects_html(stats)
    if stats.formats or stats.widths or stats.heights:
        parts.append('<h2>Images</h2><div class="dist">')
        for name, counter, label in (
            ("format", stats.formats, str),
            ("width (px)", stats.widths, size_label),
            ("height (px)", stats.heights, size_label),
        ):
            if counter:
                counts = {label(k): n for k, n in sorted(counter.items())}
                svg = _bars_svg(counts, f"{name} distribution", label_w=80, chart_w=200, fluid=True)
                parts.append(f"<div><h3>{name}</h3>{svg}</div>")
        parts.append("</div>")
    parts += _failures_html(stats.failures)
    parts.append("<h2>Samples</h2>")
    if stats.objects is not None:
        parts += _object_samples_html(stats)
        classes = []
    for key in classes:
        parts.append(f'<h3>{e(key or "(unlabelled)")}</h3><div class="sheet">')
        for data, name, split, _ in stats.samples.get(key, []):
            try:
                png, size = thumbnail_png(data)
            except (OSError, ValueError):  # verify reports undecodable images; skip here
                continue
            parts.append(
                f'<figure><img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{e(key)}">'
                f"{_caption(name, split, size, len(data))}</figure>"
            )
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _objects_html(stats: DatasetStats) -> list[str]:
    """The Objects section: per split, objects per class and COCO size (a table), the images
    without objects, and the objects per class as bars."""
    e = html.escape
    heads = "".join(f"<th>{name}</th>" for name in SIZE_NAMES)
    parts = [
        "<h2>Objects</h2><p>Sizes as COCO's evaluation names them, by the object's area in the "
        "written image: small &lt; 32², medium &lt; 96², large the rest.</p>",
        f'<table class="objects"><tr><th>split</th><th>class</th><th>objects</th>{heads}</tr>',
    ]
    for split, classes in stats.objects.items():
        sizes = stats.object_sizes(split)
        cells = "".join(f"<th>{sizes[name]:,}</th>" for name in SIZE_NAMES)
        parts.append(f"<tr><th>{e(split)}</th><th>all</th><th>{sizes.total():,}</th>{cells}</tr>")
        for name, counts in classes.items():
            cells = "".join(f"<td>{counts[size]:,}</td>" for size in SIZE_NAMES)
            parts.append(f"<tr><td></td><td>{e(name)}</td><td>{counts.total():,}</td>{cells}</tr>")
    parts.append("</table>")
    for split, classes in stats.objects.items():
        background, records = stats.background[split], stats.split_total(split).records
        parts += [
            f"<h3>{e(split)}</h3><p>{background:,} of {records:,} images without objects.</p>",
            _bars_svg({name: counts.total() for name, counts in classes.items()}, f"objects of {split}"),
        ]
    return parts


def _object_samples_html(stats: DatasetStats) -> list[str]:
    """Samples per object class (an image in each class it shows), then images without
    objects, each with its boxes, class names, masks and class map drawn."""
    e = html.escape
    index = {name: i for i, name in enumerate(stats.class_names)}
    keys = sorted((k for k in stats.samples if k is not None), key=lambda k: index.get(k, len(index)))
    parts = []
    for key in [*keys, None] if None in stats.samples else keys:
        heading = NO_OBJECTS if key is None else key
        parts.append(f'<h3>{e(heading)}</h3><div class="sheet">')
        for data, name, split, drawn in stats.samples[key]:
            try:
                frame, size = thumbnail(data, OBJECT_THUMBNAIL_PX)
            except (OSError, ValueError):  # verify reports undecodable images; skip here
                continue
            svg = objects_svg(frame, size, drawn, stats.class_names, f"{name}: {heading}")
            caption = _caption(name, split, size, len(data), len(drawn.boxes))
            parts.append(f'<figure class="objects">{svg}{caption}</figure>')
        parts.append("</div>")
    return parts


def main(argv: list[str]) -> int:
    parser = CommandParser("inspect", __doc__)
    parser.add_argument(
        "--report", help="Write a self-contained HTML report to this path (none if not given)."
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="Sample images per class.")
    parser.add_argument(
        "--failures",
        type=int,
        default=DEFAULT_FAILURE_EXAMPLES,
        help="Failed images listed per reason in the report.",
    )
    args = parser.parse_args(argv)
    stats = collect_stats(args.output_dir, args.samples if args.report else 0, args.failures)
    print(format_table(stats))
    if args.report:
        page = render_report(stats, f"img2tfrecord dataset: {args.output_dir}")
        with FileSystems.create(args.report, mime_type="text/html") as f:
            f.write(page.encode("utf-8"))
        print(f"report written to {args.report}", file=sys.stderr)
    return 1 if stats.bad else 0
