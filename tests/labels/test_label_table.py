"""Labels table: parsing functions, the join on thousands of rows, --labels disambiguation."""

import io
import re
import unicodedata
import zlib

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.cli.options import ConvertOptions, is_job_label, route_labels_flag
from tests.labels.orphan_rows import orphan_rows
from transforms.batching import CountImagesFn, chunked
from transforms.coders import ArrowBatchCoder
from transforms.labels.beam_table import JoinLabels, ReadLabels
from transforms.labels.folders import class_index_for
from transforms.labels.join import JoinResult, bucket_count, files_batch, join_bucket, join_key, resolve_rows
from transforms.labels.rows import (
    KEY,
    JoinSettings,
    LabelRow,
    TableError,
    TableSpec,
    decode_text,
    label_rows,
    rows_batch,
)
from transforms.labels.table import (
    check_table,
    convert_extra,
    detect_format,
    image_key,
    iter_row_batches,
    iter_table,
    parse_extra_columns,
    split_labels,
)
from transforms.output.orphan_log import OrphanRow
from transforms.records import BATCH_SIZE, ClassIndex, FileBatch, ImageFile

CSV = TableSpec(path="t.csv", format="csv")


def _rows(text: bytes, spec: TableSpec = CSV) -> list[LabelRow]:
    return list(iter_table(io.BytesIO(text), spec, "t.csv"))


def bucket_of(key: str, buckets: int) -> int:
    """The join bucket of a key, as specified: the range of `buckets` equal ranges the crc32 of
    its bytes (UTF-8, an undecodable name's surrogates passed) falls in."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) * buckets >> 32


def orphan_order(orphans) -> list[OrphanRow]:
    """The orphans as one sorted list (OrphanRow.order; its reference: keys by their first
    row, a key's rows together in file order)."""
    orphans = sorted(orphans, key=lambda o: (o.source, o.line, o.key, o.reason))
    first: dict[str, int] = {}
    for i, o in enumerate(orphans):
        first.setdefault(o.key, i)
    return sorted(orphans, key=lambda o: first[o.key])


def _merged(results: list[JoinResult]) -> JoinResult:
    """The results of several buckets as one."""
    out = JoinResult()
    for result in results:
        for mine, theirs in zip(out.columns, result.columns):
            mine.extend(theirs)
        out.failures += result.failures
        out.orphans += result.orphans
        for name, n in result.stats.items():
            out.count(name, n)
    return out


def _orphans(result: JoinResult) -> list[OrphanRow]:
    """A result's orphan rows as OrphanRows (their first row filled in)."""
    return [o for table in result.orphans for o in orphan_rows(table)]


def _join(images=(), rows=(), settings: JoinSettings = JoinSettings(), mode: str = "stem") -> JoinResult:
    """join_bucket of these ImageFiles and LabelRows (keys by image_key, as BucketImages)."""
    files = pa.Table.from_batches([files_batch(FileBatch(images), mode)])
    return join_bucket(files, pa.Table.from_batches([rows_batch(rows)]), settings)


def test_detect_format_and_extra_columns():
    assert detect_format("gs://b/labels.CSV") == "csv" and detect_format("x.tsv.gz") == "tsv"
    assert detect_format("a/b.jsonl") == "jsonl" and detect_format("a/b.txt", "tsv") == "tsv"
    with pytest.raises(ValueError, match="--labels_format"):
        detect_format("labels.txt")
    assert parse_extra_columns(" weight:float, source:str ") == (("weight", "float"), ("source", "str"))
    assert parse_extra_columns("") == ()
    for bad in ("weight", "w:double", "a:int,a:str"):
        with pytest.raises(ValueError, match="--extra_columns"):
            parse_extra_columns(bad)


def test_image_key_modes_and_unicode_normalization():
    rel = "서울/경복궁/SE_0001.JPG"
    assert image_key(rel, "stem") == "SE_0001"
    assert image_key(rel, "name") == "SE_0001.JPG"
    assert image_key(rel, "relpath") == rel
    decomposed = unicodedata.normalize("NFD", rel)
    assert decomposed != rel and image_key(decomposed, "relpath") == rel  # macOS names match NFC tables
    assert image_key("a.b.c.png", "stem") == "a.b.c"


def test_split_labels_and_extras():
    assert split_labels("a| b |a||c") == ("a", "b", "c")
    assert split_labels("a|b", "") == ("a|b",)
    assert split_labels(["x", 3]) == ("x", "3") and split_labels(7) == ("7",) and split_labels("") == ()
    with pytest.raises(ValueError):
        split_labels(1.5)
    assert convert_extra("n", "int", " 12 ") == 12 and convert_extra("w", "float", "0.5") == 0.5
    assert convert_extra("s", "str", "") == "" and convert_extra("n", "int", 3.0) == 3
    for kind, value in (("int", "1.5"), ("float", "abc"), ("int", ""), ("float", True)):
        with pytest.raises(ValueError, match="column"):
            convert_extra("c", kind, value)


def test_csv_quoting_korean_bom_and_bad_rows():
    text = (
        "\ufeffid,label,note\n"
        '"SE,1","경복궁|남산",plain\n'
        'a2,"""quoted""","multi\nline"\n'
        "\n"
        "a3,dog\n"  # too few fields
        ",cat,x\n"  # no key
        "a5,,x\n"  # empty label: unlabeled, not invalid
    ).encode("utf-8")
    rows = _rows(text)
    assert [(r.key, r.labels, r.line, r.error is None) for r in rows] == [
        ("SE,1", ("경복궁", "남산"), 2, True),
        ("a2", ('"quoted"',), 3, True),
        ("a3", (), 6, False),
        ("", (), 7, False),
        ("a5", (), 8, True),
    ]
    assert "fields" in rows[2].error and "key column" in rows[3].error
    with pytest.raises(TableError, match=r"t.csv line 9 is not UTF-8"):  # the table, not a row
        _rows(text + b"a6,\xff\xfe,x\n")
    with pytest.raises(TableError, match="no column 'label'"):
        _rows(b"id,class\n1,a\n")
    tsv = TableSpec(path="t.tsv", format="tsv", split_column="split")
    assert _rows(b"id\tlabel\tsplit\nk\tv\ttest\nj\tv\t../x\n", tsv)[0].split == "test"
    assert "not a valid split" in _rows(b"id\tlabel\tsplit\nj\tv\t../x\n", tsv)[0].error


def test_labels_with_line_breaks_or_control_characters_are_invalid_rows():
    """A label goes into labels.txt one a line: a line break inside it is a bad row, not a class."""
    text = 'id,label\na,"cat\ndog"\nb,zebra\nc,"x\u0085y"\nd,"ok|tab\tbed"\ne," cat\n"\n'.encode()
    rows = _rows(text)
    assert [(r.key, r.labels, r.line) for r in rows] == [
        ("a", (), 2),
        ("b", ("zebra",), 4),
        ("c", (), 5),
        ("d", (), 6),
        ("e", ("cat",), 7),  # outer blanks (a trailing line break too) are stripped, as always
    ]
    assert [r.error for r in rows[:4]] == [
        "label 'cat\\ndog' contains a control character (line break, tab, ...)",
        None,
        "label 'x\\x85y' contains a control character (line break, tab, ...)",
        "label 'tab\\tbed' contains a control character (line break, tab, ...)",
    ]
    jsonl = TableSpec(path="t.jsonl", format="jsonl")
    (row,) = iter_table(io.BytesIO(b'{"id": "a", "label": ["ok", "line\\nbreak"]}\n'), jsonl, "t.jsonl")
    assert row.labels == () and "control character" in row.error


def test_an_unterminated_quote_is_a_table_error():
    """An opening quote never closed takes in every later line: the table is refused (one line)."""
    for text in (b'id,label\na,"cat\nb,dog\nc,ant\n', b'id,label\na,dog\nb,"cat'):
        with pytest.raises(TableError, match=r"t.csv line \d: a quoted field is never closed"):
            _rows(text)
    # Closed at the very end of the data (no final newline): a row like any other.
    assert [r.labels for r in _rows(b'id,label\na,"c""at"')] == [('c"at',)]


def test_jsonl_rows():
    spec = TableSpec(path="t.jsonl", format="jsonl", extra_columns=(("w", "float"),))
    text = b'{"id": "a", "label": ["x", "y"], "w": 1}\n\nnot json\n[1]\n{"id": 5, "label": 3, "w": 0.5}\n'
    rows = list(iter_table(io.BytesIO(text), spec, "t.jsonl"))
    assert rows[0].labels == ("x", "y") and rows[0].extras == (("w", 1.0),) and rows[0].line == 1
    assert "not JSON" in rows[1].error and "not a JSON object" in rows[2].error
    assert rows[3].key == "5" and rows[3].labels == ("3",) and rows[3].line == 5


def test_resolve_rows_policies():
    a = LabelRow("k", ("x",), source="t", line=2)
    a2 = LabelRow("k", ("x",), source="t", line=9)
    b = LabelRow("k", ("y",), source="t", line=5)
    assert resolve_rows([a2, a], "fail") == (a, None, False)  # identical rows merge
    row, problem, conflict = resolve_rows([b, a], "fail")
    assert row is None and conflict and "x at t:2" in problem and "y at t:5" in problem
    assert resolve_rows([b, a], "first") == (a, None, True)
    row, problem, conflict = resolve_rows([b, a], "union")
    assert row.labels == ("x", "y") and not conflict
    split_clash = LabelRow("k", ("y",), split="test", source="t", line=5)
    assert resolve_rows([a, split_clash], "union")[0] is None


def test_join_key_outcomes():
    img = ImageFile("/d/val/k.jpg", "val/k.jpg", 10)
    row = LabelRow("k", ("x",), source="t", line=2)
    out = join_key("k", [img], [row], JoinSettings(split_from_folders=True))
    assert out.records[0].labels == ("x",) and out.records[0].split == "val"
    out = join_key("k", [img], [], JoinSettings())
    assert "label missing" in out.failures[0].reason and out.failures[0].stage == "label"
    out = join_key("k", [img], [], JoinSettings(unlabeled="skip"))
    assert not out.records and not out.failures and out.stats["unlabeled_skipped"] == 1
    out = join_key("k", [img], [LabelRow("k", (), source="t", line=4)], JoinSettings(unlabeled="keep"))
    assert out.records[0].labels == () and out.stats["unlabeled_kept"] == 1
    out = _join([], [row], JoinSettings())
    assert _orphans(out)[0].reason == "no image with this key" and out.stats["orphan_rows"] == 1
    out = join_key("k", [img], [LabelRow("k", ("007",))], JoinSettings(label_type="int"))
    assert out.records[0].labels == ("7",)
    out = join_key("k", [img], [LabelRow("k", ("cat",))], JoinSettings(label_type="int"))
    assert "not a non-negative integer" in out.failures[0].reason
    bad = LabelRow("k", error="column 'w' is empty", source="t", line=3)
    out = join_key("k", [img], [row, bad], JoinSettings())
    assert "t:3" in out.failures[0].reason and out.stats["invalid_rows"] == 1


def test_class_index_for():
    assert class_index_for(["b", "a", "b"], 1) == ClassIndex(("a", "b"), 1)
    idx = class_index_for(["3", "1"], 0, "auto")
    assert idx.names == ("0", "1", "2", "3") and idx.id_of("3") == 3
    idx = class_index_for(["3", "1"], 1, "auto")
    assert idx.offset == 1 and idx.id_of("1") == 1 and idx.id_of("3") == 3
    assert class_index_for(["10", "9"], 0, "str").names == ("10", "9")
    assert class_index_for(["007", "1"], 0, "auto").names == ("007", "1")  # not canonical: names
    with pytest.raises(ValueError, match="label_type str"):
        class_index_for(["5000000"], 0, "int")


def test_labels_flag_routing():
    assert is_job_label("airflow-version=v3-0-0") and is_job_label('{"team": "ml"}')
    assert not is_job_label("gs://bucket/train.csv") and not is_job_label("labels.csv")
    argv = [
        "--labels",
        "gs://b/train.csv",
        "--labels=airflow-version=v3-0-0",
        "--labels",
        "team=vision",
        "--labels_path=x",
    ]
    routed = route_labels_flag(argv)
    assert routed == [
        "--labels_path=gs://b/train.csv",
        "--labels=airflow-version=v3-0-0",
        "--labels",
        "team=vision",
        "--labels_path=x",
    ]
    options = PipelineOptions(route_labels_flag(argv[:5]))
    assert options.view_as(GoogleCloudOptions).labels == ["airflow-version=v3-0-0", "team=vision"]
    assert options.view_as(ConvertOptions).labels_path == "gs://b/train.csv"
    plain = PipelineOptions(route_labels_flag(["--labels=./train.csv"]))
    assert plain.view_as(ConvertOptions).labels_path == "./train.csv"
    assert not plain.view_as(GoogleCloudOptions).labels


def test_check_table_reads_only_the_header(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('"id","la\nbel"\n1,a\n', encoding="utf-8")
    with pytest.raises(TableError, match="no column 'label'"):
        check_table(TableSpec(path=str(path), format="csv"))
    assert check_table(TableSpec(path=str(path), format="csv", label_column="la\nbel")) == [str(path)]
    (tmp_path / "t.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(TableError, match="no field 'label'"):
        check_table(TableSpec(path=str(tmp_path / "t.jsonl"), format="jsonl"))


def test_read_and_join_thousands_of_rows(tmp_path):
    """ReadLabels on two real CSV files (a glob) and the CoGroupByKey join, 6,000 rows."""
    n = 5000
    part1 = ["id,label"] + [f"img{i:05d},c{i % 7}" for i in range(0, n, 2)]
    part2 = ["id,label"] + [f"img{i:05d},c{i % 7}" for i in range(1, n, 2)]
    part2 += [f"orphan{i},c0" for i in range(500)]  # rows without images
    part2 += [f"img{i:05d},c{(i + 1) % 7}" for i in range(300)]  # 300 conflicting duplicates
    part2 += [f"img{i:05d},c{i % 7}" for i in range(300, 500)]  # 200 agreeing duplicates
    (tmp_path / "labels-1.csv").write_text("\n".join(part1) + "\n")
    (tmp_path / "labels-2.csv").write_text("\n".join(part2) + "\n")
    images = [ImageFile(f"/d/c/img{i:05d}.jpg", f"c/img{i:05d}.jpg", 100) for i in range(n + 400)]
    spec = TableSpec(path=str(tmp_path / "labels-*.csv"), format="csv")
    with TestPipeline() as p:
        rows = p | ReadLabels(spec)
        files = p | "Images" >> beam.Create([FileBatch(chunk) for chunk in chunked(images)])
        joined = (files, rows) | JoinLabels("stem", JoinSettings())
        # Rows are read a block of a file at a time, as Arrow batches (2,500 and 3,500 rows).
        assert_that(
            rows | "RowBatchSizes" >> beam.Map(lambda batch: batch.num_rows),
            equal_to([2500, 3500]),
            label="CheckRowBatches",
        )
        # Batched by bucket: up to BATCH_SIZE records a batch, not one a record.
        assert_that(
            joined.records | "BadSizes" >> beam.Filter(lambda b: not 0 < len(b) <= BATCH_SIZE),
            equal_to([]),
            label="CheckBatchSizes",
        )
        assert_that(
            joined.records | "CountBatches" >> beam.combiners.Count.Globally() | beam.Map(lambda n: n < 50),
            equal_to([True]),
            label="CheckBatched",
        )
        records = joined.records | "Records" >> beam.FlatMap(lambda b: b.records)
        assert_that(
            records | "CountRecords" >> beam.combiners.Count.Globally(),
            equal_to([n - 300]),
            label="CheckRecords",
        )
        assert_that(
            records | "Wrong" >> beam.Filter(lambda r: r.labels != (f"c{int(r.relpath[5:10]) % 7}",)),
            equal_to([]),
            label="CheckLabels",
        )
        assert_that(
            joined.failed | "Reasons" >> beam.Map(lambda f: f.reason.split(":")[0].split(" ")[0]),
            equal_to(["conflicting"] * 300 + ["label"] * 400),
            label="CheckFailed",
        )
        assert_that(
            joined.stats | "Sum" >> beam.CombinePerKey(sum),
            equal_to(
                [
                    ("rows", n + 1000),
                    ("matched_rows", n + 500),
                    ("orphan_rows", 500),
                    ("duplicate_keys", 500),
                    ("conflicting_keys", 300),
                    ("unlabeled_images", 400),
                ]
            ),
            label="CheckStats",
        )
        assert_that(
            joined.listed | "CountListed" >> beam.CombineGlobally(CountImagesFn()),
            equal_to([n + 400]),
            label="CheckListed",
        )


def _mixed_join_input() -> tuple[list[ImageFile], list[LabelRow]]:
    """Images and rows with every outcome: labelled, multi-label, extras, agreeing and
    conflicting duplicates, a bad row, an empty label, unlabeled images, orphans (one key twice),
    several images of one key, an undecodable file name."""
    images = [
        ImageFile(f"/d/c{i % 3}/img{i:04d}.jpg", f"c{i % 3}/img{i:04d}.jpg", 100 + i) for i in range(300)
    ]
    images += [ImageFile("/d/other/img0001.jpg", "other/img0001.jpg", 7)]  # a key with two images
    images += [ImageFile("/d/c0/\udcff.jpg", "c0/\udcff.jpg", 9)]  # no row: unlabeled
    rows = []
    for i in range(250):
        labels = (f"c{i % 3}", "x") if i % 10 == 1 else (f"c{i % 3}",)
        rows.append(LabelRow(f"img{i:04d}", labels, extras=(("w", i / 4),), source="t.csv", line=i + 2))
    rows.append(LabelRow("img0003", ("c0",), extras=(("w", 0.75),), source="t.csv", line=300))  # agrees
    rows.append(LabelRow("img0004", ("other",), extras=(("w", 1.0),), source="t.csv", line=301))  # conflict
    rows.append(LabelRow("img0005", error="column 'w' is empty", source="t.csv", line=302))  # bad row
    rows.append(LabelRow("img0260", (), source="t.csv", line=303))  # empty label
    rows += [LabelRow(f"orphan{i % 7}", ("c1",), source="t.csv", line=310 + i) for i in range(10)]
    return images, rows


@pytest.mark.parametrize("unlabeled", ["fail", "keep", "skip"])
def test_join_bucket_is_the_same_whatever_the_bucket_count(unlabeled):
    """join_bucket over 1 bucket and over 1..many: the same records, failures, orphans, stats."""
    images, rows = _mixed_join_input()
    settings = JoinSettings(unlabeled=unlabeled)
    whole = _join(images, rows, settings)
    assert whole.stats["orphan_rows"] == 10 and whole.stats["conflicting_keys"] == 1
    assert whole.stats["keys_with_several_images"] == 1 and whole.stats["invalid_rows"] == 1
    assert len(whole.records) + len(whole.failures) + whole.stats.get("unlabeled_skipped", 0) == len(images)

    def canonical(result):
        return (
            sorted(result.records, key=lambda r: r.path),
            sorted(result.failures, key=lambda f: f.path),
            orphan_order(_orphans(result)),
            result.stats,
        )

    for buckets in (2, 7, 1000):
        parts: dict[int, tuple[list, list]] = {}
        for f in images:
            parts.setdefault(bucket_of(image_key(f.relpath, "stem"), buckets), ([], []))[0].append(f)
        for r in rows:
            parts.setdefault(bucket_of(r.key, buckets), ([], []))[1].append(r)
        merged = _merged([_join(i, r, settings) for i, r in parts.values()])
        assert len(parts) > 1
        assert canonical(merged) == canonical(whole), buckets


def test_bucket_count_and_orphan_order():
    assert bucket_count(0, 0) == 1 and bucket_count(1000, 10) == 1 and bucket_count(1001, 10) == 2
    assert bucket_count(5, 2_500_000) == 2500 and bucket_count(7, 3, per_bucket=2) == 4
    rows = [
        OrphanRow(k, "t.csv", line, "no image with this key") for k, line in [("b", 9), ("a", 4), ("b", 2)]
    ]
    rows.append(OrphanRow("a", "s.csv", 7, "no image with this key"))
    # Keys by their first row (file, line), a key's rows together: the per-key join's order.
    assert [(o.key, o.source, o.line) for o in orphan_order(reversed(rows))] == [
        ("a", "s.csv", 7),
        ("a", "t.csv", 4),
        ("b", "t.csv", 2),
        ("b", "t.csv", 9),
    ]


def test_arrow_coder_round_trips_rows_and_images():
    """One Arrow IPC coder for rows and images: every column back with its type (floats stay
    floats, undecodable file names their surrogates, all-null columns their type)."""
    images, rows = _mixed_join_input()
    coder = ArrowBatchCoder()
    batch = rows_batch(rows)
    decoded = coder.decode(coder.encode(batch))
    assert decoded.equals(batch) and decoded.schema == batch.schema
    assert label_rows(decoded) == rows and type(label_rows(decoded)[0].extras[0][1]) is float
    for files in (images[:3], images):  # the last image has an undecodable name
        part = files_batch(FileBatch(files), "stem")
        assert coder.decode(coder.encode(part)).equals(part)
    assert decode_text(files_batch(FileBatch(images), "stem").column(KEY))[-1] == "\udcff"
    clean = rows_batch([LabelRow("k", ("a",), source="t.csv", line=2)])  # split and error all null
    assert len(coder.encode(clean)) < len(coder.encode(rows_batch(rows[:1])))
    assert coder.decode(coder.encode(clean)).equals(clean)


@pytest.mark.parametrize("per_bucket", [1_000_000, 15])  # one bucket; 21 buckets
def test_join_labels_same_output_with_one_bucket_or_many(tmp_path, per_bucket):
    """JoinLabels in a real pipeline: the outputs do not depend on the bucket count."""
    images, rows = _mixed_join_input()
    rows = [r for r in rows if r.error is None]  # written as a CSV below; the bad row comes from a bad cell
    lines = ["id,label,w"] + [f"{r.key},{'|'.join(r.labels)},{dict(r.extras).get('w', 1.0)}" for r in rows]
    lines.append("img0005,c2,")  # an empty extra: a bad row
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    spec = TableSpec(path=str(tmp_path / "t.csv"), format="csv", extra_columns=(("w", "float"),))
    with open(tmp_path / "t.csv", "rb") as f:
        expected = _join(
            images, list(iter_table(f, spec, str(tmp_path / "t.csv"))), JoinSettings(unlabeled="keep")
        )
    assert expected.stats["invalid_rows"] == 1 and expected.stats["orphan_rows"] == 10
    with TestPipeline() as p:
        table = p | ReadLabels(spec)
        files = p | "Images" >> beam.Create([FileBatch(chunk) for chunk in chunked(images, 64)])
        joined = (files, table) | JoinLabels("stem", JoinSettings(unlabeled="keep"), per_bucket=per_bucket)
        assert_that(
            joined.records | "Records" >> beam.FlatMap(lambda b: b.records),
            equal_to(expected.records),
            label="CheckRecords",
        )
        assert_that(joined.failed, equal_to(expected.failures), label="CheckFailed")
        orphans = [(o.order(), o.to_json()) for o in _orphans(expected)]
        lines = joined.orphans | "Lines" >> beam.FlatMap(
            lambda o: [(r.order(), r.to_json()) for r in orphan_rows(o)]
        )
        assert_that(lines, equal_to(orphans), label="CheckOrphans")
        assert_that(
            joined.stats | beam.CombinePerKey(sum), equal_to(list(expected.stats.items())), label="CheckStats"
        )
        assert_that(
            table | "Sizes" >> beam.Map(lambda b: b.num_rows), equal_to([len(rows) + 1]), label="OneBatch"
        )


@pytest.fixture
def gcs_bucket(monkeypatch):
    """A bucket on a local gcp-storage-emulator server (no network, no mocks)."""
    import socket

    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    sock = socket.socket()
    sock.bind(("localhost", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{port}")
    # Anonymous access right away: Beam otherwise retries the credential lookup for ~25 s.
    from apache_beam.internal.gcp import auth

    monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)
    server = create_server("localhost", port, in_memory=True, default_bucket="labels-bkt")
    server.start()
    try:
        yield storage.Client(credentials=AnonymousCredentials(), project="test").bucket("labels-bkt")
    finally:
        server.stop()


def test_read_labels_from_gcs(gcs_bucket):
    gcs_bucket.blob("tables/part-1.csv").upload_from_string("id,label\nk1,서울\n".encode())
    gcs_bucket.blob("tables/part-2.csv").upload_from_string(b'id,label\n"k2","a|b"\n')
    spec = TableSpec(path="gs://labels-bkt/tables/part-*.csv", format="csv")
    assert check_table(spec) == ["gs://labels-bkt/tables/part-1.csv", "gs://labels-bkt/tables/part-2.csv"]
    with TestPipeline() as p:
        rows = p | ReadLabels(spec) | beam.FlatMap(label_rows)
        assert_that(
            rows | beam.Map(lambda r: (r.key, r.labels, r.source.rsplit("/", 1)[1], r.line)),
            equal_to([("k1", ("서울",), "part-1.csv", 2), ("k2", ("a", "b"), "part-2.csv", 2)]),
        )
    with pytest.raises(TableError, match="no such file"):
        check_table(TableSpec(path="gs://labels-bkt/nope.csv", format="csv"))


def test_read_labels_from_compressed_tables(tmp_path):
    """A .gz table (CSV and JSON Lines) is read decompressed, as a stream, by ReadLabels."""
    import gzip

    (tmp_path / "t.csv.gz").write_bytes(gzip.compress('\ufeffid,label\nk1,"a\nb"\nk2,서울\n'.encode()))
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(b'{"id": "k3", "label": ["x", "y"]}\n'))
    for name, expected in (
        ("t.csv.gz", [("k1", (), 2), ("k2", ("서울",), 4)]),
        ("t.jsonl.gz", [("k3", ("x", "y"), 1)]),
    ):
        spec = TableSpec(path=str(tmp_path / name), format=detect_format(name))
        with TestPipeline() as p:
            rows = p | ReadLabels(spec) | beam.FlatMap(label_rows)
            assert_that(rows | beam.Map(lambda r: (r.key, r.labels, r.line)), equal_to(expected))


def test_join_labels_with_an_empty_table(tmp_path):
    """No rows at all: the counts read as 0 (one bucket) and every image is unlabeled."""
    (tmp_path / "t.csv").write_text("id,label\n")
    images = [ImageFile(f"/d/img{i}.jpg", f"img{i}.jpg", 1) for i in range(5)]
    with TestPipeline() as p:
        table = p | ReadLabels(TableSpec(path=str(tmp_path / "t.csv"), format="csv"))
        files = p | "Images" >> beam.Create([FileBatch(tuple(images))])
        joined = (files, table) | JoinLabels("stem", JoinSettings())
        assert_that(joined.failed | beam.Map(lambda f: f.path), equal_to([f.path for f in images]))
        assert_that(
            joined.stats | beam.CombinePerKey(sum), equal_to([("unlabeled_images", 5)]), label="CheckStats"
        )


def _bucketed(batches, images: int, rows: int, per_bucket: int, mode: str | None = None) -> list:
    """BucketFn over one bundle of `batches` (FileBatches with `mode`, else Arrow batches of
    rows): [(bucket, Arrow batch)]."""
    from transforms.labels.beam_table import BucketFn

    fn = BucketFn(per_bucket, mode)
    fn.start_bundle()
    sent = [out for batch in batches for out in fn.process(batch, images, rows)]
    return sent + [w.value for w in fn.finish_bundle()]


def test_bucket_parts_are_gathered_over_the_bundle():
    """A bucket's items of the bundle's batches go out together (not one tiny part per batch
    and bucket), each item in the bucket of its key's hash range, none lost or changed."""
    images = [ImageFile(f"/d/img{i:05d}.jpg", f"img{i:05d}.jpg", i) for i in range(5 * BATCH_SIZE)]
    batches = [FileBatch(chunk) for chunk in chunked(images)]
    sent = _bucketed(batches, len(images), 10, 2 * BATCH_SIZE, "stem")  # 3 buckets
    assert len(sent) == 3 and sorted(b for b, _ in sent) == [0, 1, 2]
    from tests.labels.orphan_rows import image_files

    got = [(b, f) for b, part in sent for f in image_files(part)]
    assert sorted((f for _, f in got), key=str) == sorted(images, key=str)
    assert all(bucket_of(image_key(f.relpath), 3) == b for b, f in got)
    assert all(
        decode_text(part.column(KEY)) == [image_key(f.relpath) for f in image_files(part)] for _, part in sent
    )
    batch = rows_batch(LabelRow(f"k{i}", (f"c{i % 3}",), line=i) for i in range(10))
    parts = _bucketed([batch], 0, 10, per_bucket=1)  # 10 buckets for 10 rows
    assert sorted(r for _, p in parts for r in label_rows(p)) == sorted(label_rows(batch))
    assert all(bucket_of(r.key, 10) == b for b, p in parts for r in label_rows(p))


def test_bucket_fn_sends_what_it_holds_at_the_limit(monkeypatch):
    """Past _MAX_HELD items held, every part is sent (bounds the DoFn's memory)."""
    import transforms.labels.beam_table as label_table

    monkeypatch.setattr(label_table, "_MAX_HELD", 25)
    fn = label_table.BucketFn(per_bucket=BATCH_SIZE)
    fn.start_bundle()
    batch = rows_batch(LabelRow(f"k{i}", ("a",), line=i) for i in range(10))
    assert list(fn.process(batch, 0, 10)) == [] and list(fn.process(batch, 0, 10)) == []
    sent = list(fn.process(batch, 0, 10))
    assert [p.num_rows for _, p in sent] == [30] and [w.value for w in fn.finish_bundle()] == []


def test_write_orphans_in_parts_keeps_the_order_of_one_sorted_list(tmp_path, monkeypatch):
    """WriteOrphans writes a part per chunk of table lines and appends them: the same file as
    one list sorted by orphan_order (a key's rows together, where its first row is)."""
    import json

    import transforms.output.orphan_log as label_orphans
    from transforms.labels.rows import ORPHANS, STATS
    from transforms.output.beam_orphans import WriteOrphans

    monkeypatch.setattr(label_orphans, "CHUNK_LINES", 3)  # many parts from a few rows
    rows = [LabelRow(f"k{i % 9}", ("a",), source=f"t{i % 2}.csv", line=i + 2) for i in range(40)]
    rows.append(LabelRow("", source="t0.csv", line=99, error="no value in key column 'id'"))
    result = _join(rows=rows)
    assert len(_orphans(result)) == 41
    spec = TableSpec(path="t*.csv", format="csv")
    with TestPipeline() as p:
        # As the join sends them: a batch per bucket (here a few buckets).
        whole = result.orphans[0].combine_chunks()
        batches = [whole.slice(i, 7).to_batches()[0] for i in range(0, 41, 7)]
        orphans = p | "Orphans" >> beam.Create(batches)
        stats = p | "Stats" >> beam.Create(list(result.stats.items()))
        summary = {ORPHANS: orphans, STATS: stats} | WriteOrphans(str(tmp_path), spec, JoinSettings())
        assert_that(summary | beam.Map(lambda s: s["labels"]["orphan_rows"]), equal_to([41]))
    expected = [o.to_json() + "\n" for o in orphan_order(_orphans(result))]
    assert (tmp_path / "orphan_labels.jsonl").read_text(encoding="utf-8") == "".join(expected)
    # The parts stay beside it (a retried Concatenate reads them again): they go with the run's
    # staging folder when it is published.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "orphan_labels.jsonl" and len(names) > 2
    assert all(n.startswith("orphan_labels.jsonl.part-") for n in names[1:])
    assert json.loads(expected[0]) == {
        "key": "k0",
        "line": 2,
        "reason": "no image with this key",
        "source": "t0.csv",
    }


def test_write_orphans_without_orphans_writes_an_empty_file(tmp_path):
    from transforms.labels.rows import ORPHANS, STATS
    from transforms.output.beam_orphans import WriteOrphans

    with TestPipeline() as p:
        orphans = p | "Orphans" >> beam.Create([]).with_output_types(pa.RecordBatch)
        stats = p | "Stats" >> beam.Create([("rows", 0)])
        _ = {ORPHANS: orphans, STATS: stats} | WriteOrphans(str(tmp_path), CSV, JoinSettings())
    assert (tmp_path / "orphan_labels.jsonl").read_bytes() == b""


def _reference_rows(data: bytes, spec: TableSpec) -> list[LabelRow]:
    """The rows as the csv module gives them, each made by parse_row from a dict: the
    reference the column path must match. Lines end at LF, CRLF or a lone CR (pyarrow's
    rule); a line that is not UTF-8, or an odd number of quotes (a quoted field never closed),
    refuses the table (TableError)."""
    import csv

    from transforms.labels.table import check_header, normalize_key, parse_row

    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TableError(f"t.csv line {number} is not UTF-8") from None
    text = data.decode("utf-8").removeprefix("\ufeff")
    if text.count('"') % 2:
        raise TableError("a quoted field is never closed")
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
    reader = csv.reader(lines, delimiter="\t" if spec.format == "tsv" else ",")
    header = next(reader)
    check_header(header, spec, "t.csv")
    header = [h.strip() for h in header]
    out, first = [], reader.line_num + 1
    for cells in reader:
        line, first = first, reader.line_num + 1
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            i = header.index(spec.key_column)
            key = normalize_key(cells[i] if len(cells) > i else "")
            error = f"{len(cells)} fields where the header has {len(header)}"
            out.append(LabelRow(key, source="t.csv", line=line, error=error))
        else:
            out.append(parse_row(dict(zip(header, cells)), spec, "t.csv", line))
    return out


@pytest.mark.parametrize("block_bytes", [256, 1 << 20])
def test_block_parser_gives_the_rows_of_the_csv_module(monkeypatch, block_bytes):
    """Random tables (quotes, CRLF, lone CR, bad UTF-8, blanks, NFD keys, extras, splits) parsed
    by pyarrow in blocks of any size: the same rows as the csv module, or a TableError where it
    refuses the table (not UTF-8, a quote never closed)."""
    import random

    import transforms.labels.table_csv as table_csv

    monkeypatch.setattr(table_csv, "BLOCK_BYTES", block_bytes)
    rnd = random.Random(block_bytes)
    parts = [
        "a",
        "k1",
        "k2",
        ",",
        ",",
        "\n",
        "\n",
        "\r\n",
        "|",
        " ",
        "é",
        "e\u0301",
        "\\",
        "./",
        "7",
        "0.5",
        "test",
    ]
    specs = [
        CSV,
        TableSpec("t.csv", "csv", extra_columns=(("w", "float"),)),
        TableSpec("t.csv", "csv", split_column="w"),
    ]
    compared = 0
    for i in range(400):
        body = "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 40))).encode()
        body += rnd.choice(
            [b"", b'x,"q""uoted\nfield",1\n', b"y,\xff\xfe,1\n", b"z,a\rb,1\n", b'q,"c\rr",1\n']
        )
        body += "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 20))).encode()
        data = "\ufeffid,label,w\n".encode() + body
        spec = specs[i % 3]
        try:
            expected = _reference_rows(data, spec)
        except (TableError, csv_error()) as e:
            message = "is not UTF-8" if "UTF-8" in str(e) else "never closed" if "never" in str(e) else ""
            with pytest.raises(TableError, match=message):
                list(iter_table(io.BytesIO(data), spec, "t.csv"))
            continue
        assert list(iter_table(io.BytesIO(data), spec, "t.csv")) == expected, data
        compared += 1
    assert compared > 200


def csv_error():
    import csv

    return csv.Error


@pytest.mark.parametrize("block_bytes", [256, 1 << 20])
def test_column_checks_give_the_rows_of_the_csv_module(monkeypatch, block_bytes):
    """Random tables of whole rows (keys to normalize or not, multi-labels, bad labels, splits,
    int and float extras, good and bad), each column checked for a block at once: the rows
    the csv module and parse_row give one by one."""
    import random

    import transforms.labels.table_csv as table_csv

    monkeypatch.setattr(table_csv, "BLOCK_BYTES", block_bytes)
    rnd = random.Random(block_bytes)
    keys = ["k1", "ké", "ke\u0301", " k2", "./k3", "/k4", "a\\b", "k5 ", "서울", "k\u200b6", "\ufeffk7"]
    labels = ["a", "b|c", "7", " d ", "a||b", "x\ty", "é", "cat\u200d", "dog house"]
    splits = ["train", "test", "../x", "val"]
    numbers = ["1", " 2 ", "0.5", "x", "", "-3", "1_0", "1e3", "+4", "inf"]
    spec = TableSpec(
        "t.csv", "csv", split_column="s", extra_columns=(("n", "int"), ("f", "float"), ("t", "str"))
    )
    for i in range(60):
        clean = i % 3 == 0  # rows whose every cell converts: the column path takes the block whole
        lines = ["id,label,s,n,f,t"]
        for j in range(rnd.randint(1, 40)):
            key = f"r{j}" if clean else rnd.choice(keys) + str(j)
            label = rnd.choice(labels[:4] if clean else labels)
            split = "train" if clean else rnd.choice(splits)
            n, f = ("5", "0.25") if clean else (rnd.choice(numbers), rnd.choice(numbers))
            lines.append(f"{key},{label},{split},{n},{f},{rnd.choice(labels)}")
        data = ("\n".join(lines) + "\n").encode()
        expected = _reference_rows(data, spec)
        got = list(iter_row_batches(io.BytesIO(data), spec, "t.csv"))
        assert [r for b in got for r in label_rows(b)] == expected, data


def test_image_keys_are_image_key_of_each():
    """The column form of image_key (any mode) on names that need normalizing and names that do not."""
    import random

    from transforms.labels.table import image_keys, normalize_keys

    rnd = random.Random(5)
    parts = ["a", "b.", ".", "/", "./", " ", "é", "e\u0301", "\\", "서울", "x.jpg", ".hidden", "..png"]
    for _ in range(300):
        relpaths = [
            "".join(rnd.choice(parts) for _ in range(rnd.randint(1, 6))) for _ in range(rnd.randint(1, 5))
        ]
        if rnd.random() < 0.5:  # also columns where nothing needs normalizing
            relpaths = [image_key(r, "relpath") or "a" for r in relpaths]
        for mode in ("stem", "name", "relpath"):
            assert image_keys(relpaths, mode) == [image_key(r, mode) for r in relpaths], (relpaths, mode)
    clean = [f"img{i}" for i in range(100)]
    assert normalize_keys(clean) == clean and normalize_keys(["./x"]) == ["x"]
    with pytest.raises(ValueError, match="--image_key"):
        image_keys(["a"], "path")


@pytest.mark.parametrize(
    "key, source",
    [('k"é\n\t\x01\u2028', "s.csv"), ("서울/a\\b", "t.tsv"), ("bad\udc80name", "gs://b/t.csv")],
)
def test_orphan_line_is_json_dumps_of_its_fields(key, source):
    """OrphanRow.to_json (built without a dict) is json.dumps of the fields, keys sorted;
    undecodable bytes (surrogates) escaped."""
    import json

    o = OrphanRow(key, source, 12_345_678_901, "no image with this key")
    fields = {"key": key, "line": o.line, "reason": o.reason, "source": source}
    expected = json.dumps(fields, sort_keys=True, ensure_ascii="\udc80" in key)
    assert o.to_json() == expected and json.loads(o.to_json()) == fields


@pytest.mark.parametrize("key", ["키{}-{}", "id{:03d}{:04d}"])  # keys of many lengths; of one length
def test_split_by_bucket_gives_the_buckets_of_the_keys(key):
    """split_by_bucket: each bucket's items (a hash range), buckets in order, items in their
    order within, every column as it was, for any bucket count."""
    from transforms.labels.join import split_by_bucket

    rows = [
        LabelRow(
            key.format(i % 37, i),
            (f"c{i % 3}",),
            "train" if i % 4 else None,
            (("w", i / 2),),
            f"t{i % 2}.csv",
            i,
        )
        for i in range(300)
    ]
    rows.append(LabelRow("bad\udcff" if "-" in key else "id9999999", error="bad", source="t.csv", line=999))
    for buckets in (1, 2, 7, 1000):
        parts = list(split_by_bucket(pa.Table.from_batches([rows_batch(rows)]), buckets))
        got = [(b, r) for b, part in parts for r in label_rows(part)]
        assert [b for b, _ in got] == sorted(b for b, _ in got)  # bucket order
        assert sorted(r for _, r in got) == sorted(rows)
        assert all(bucket_of(r.key, buckets) == b for b, r in got)
        for b, _ in parts:  # a bucket's rows in their order
            assert [r for c, r in got if c == b] == [r for r in rows if bucket_of(r.key, buckets) == b]
    from tests.labels.orphan_rows import image_files

    names = [key.format(i % 37, i) for i in range(99)]
    images = [ImageFile(f"/r/{i % 5}/{name}.jpg", f"{i % 5}/{name}.jpg", i) for i, name in enumerate(names)]
    for buckets in (1, 5):
        parts = split_by_bucket(pa.Table.from_batches([files_batch(FileBatch(images), "stem")]), buckets)
        got = [(b, f) for b, part in parts for f in image_files(part)]
        assert sorted((f for _, f in got), key=str) == sorted(images, key=str)
        assert all(bucket_of(image_key(f.relpath), buckets) == b for b, f in got)


def test_bucket_parts_cross_the_coder_intact():
    """A bucket's items of the bundle's batches go out as parts of up to PART_ROWS, and cross
    the shuffle's coder intact whatever their columns hold (one value, few, roots, nulls)."""
    from tests.labels.orphan_rows import image_files

    rows = [
        LabelRow(
            f"k{i}", (f"c{i % 3}",), None if i < 600 else f"s{i % 2}", (), "t.csv" if i < 900 else "u.csv", i
        )
        for i in range(1200)
    ]
    images = [ImageFile(f"/{'ab'[i // 600]}/k{i}.jpg", f"k{i}.jpg", i) for i in range(1200)]
    coder = ArrowBatchCoder()
    for side in ("rows", "images"):
        if side == "rows":
            sent = _bucketed([rows_batch(rows[i : i + 300]) for i in range(0, 1200, 300)], 0, 1200, 600)
        else:
            chunks = [FileBatch(images[i : i + 300]) for i in range(0, 1200, 300)]
            sent = _bucketed(chunks, 0, 1200, 600, "stem")  # 2 buckets
        assert sorted(b for b, _ in sent) == [0, 1], side
        parts = [(b, coder.decode(coder.encode(p))) for b, p in sent]
        if side == "rows":
            assert sorted(r for _, p in parts for r in label_rows(p)) == sorted(rows)
            assert all(bucket_of(r.key, 2) == b for b, p in parts for r in label_rows(p))
        else:
            got = [(b, f) for b, p in parts for f in image_files(p)]
            assert sorted((f for _, f in got), key=str) == sorted(images, key=str)
            assert all(bucket_of(image_key(f.relpath), 2) == b for b, f in got)


def test_invisible_characters_make_a_row_invalid_and_leave_keys():
    """A byte order mark or a zero-width character inside a label would make a second class
    that prints like the first: the row is invalid, named. In a key (a BOM at the start of a
    middle row, as concatenated files leave it) it is taken out, as in the image's key."""
    text = "id,label\nk1,cat\nk2,cat\u200b\nk3,\ufeffcat\n\ufeffk4,cat\nk5,\u200ddog\n".encode()
    rows = _rows(text)
    assert [(r.key, r.labels) for r in rows] == [
        ("k1", ("cat",)),
        ("k2", ()),
        ("k3", ()),
        ("k4", ("cat",)),
        ("k5", ()),
    ]
    assert rows[1].error == "label 'cat\\u200b' contains an invisible character (U+200B zero width space)"
    assert "U+FEFF" in rows[2].error and "U+200D" in rows[4].error
    assert image_key("k\u200b4.jpg") == "k4" and image_key("\ufeffk4.png") == "k4"
    out = _join([ImageFile(f"/d/{k}.jpg", f"{k}.jpg", 1) for k in ("k1", "k2", "k4")], rows)
    assert sorted(r.relpath for r in out.records) == ["k1.jpg", "k4.jpg"]
    assert [f.reason for f in out.failures] == [
        "bad row for key 'k2' in the labels table (t.csv:3): "
        "label 'cat\\u200b' contains an invisible character (U+200B zero width space)"
    ]


def test_a_conflict_between_a_label_and_an_empty_label_is_a_conflict():
    """--duplicate_keys fail: rows `cat` and an empty label disagree (not silently `cat`);
    first: the first row as it is; union: `cat`."""
    img = [ImageFile("/d/k.jpg", "k.jpg", 1)]
    rows = [LabelRow("k", ("cat",), source="t.csv", line=2), LabelRow("k", (), source="t.csv", line=3)]
    out = _join(img, rows, JoinSettings(duplicates="fail"))
    assert not out.records and out.stats["conflicting_keys"] == 1
    assert (
        out.failures[0].reason
        == "conflicting rows for key 'k' in the labels table: cat at t.csv:2; (no label) at t.csv:3"
    )
    assert _join(img, rows, JoinSettings(duplicates="union")).records[0].labels == ("cat",)
    assert _join(img, rows, JoinSettings(duplicates="first")).records[0].labels == ("cat",)
    first_empty = _join(
        img, rows[::-1] and [rows[1]._replace(line=1), rows[0]], JoinSettings(duplicates="first")
    )
    assert "empty label" in first_empty.failures[0].reason


def test_a_json_list_inside_a_list_is_a_named_failure_not_flattened():
    spec = TableSpec(path="t.jsonl", format="jsonl")
    text = b'{"id": "a", "label": [["cat"], "dog"]}\n{"id": "b", "label": ["cat", {"x": 1}]}\n{"id": "c", "label": ["cat", 7]}\n'
    rows = list(iter_table(io.BytesIO(text), spec, "t.jsonl"))
    assert [r.labels for r in rows] == [(), (), ("cat", "7")]
    assert (
        rows[0].error
        == "label [['cat'], 'dog'] holds a list or object inside its list (labels are text or integers)"
    )
    assert "inside its list" in rows[1].error


def test_a_listing_that_fails_names_the_store_error_not_no_such_file(gcs_bucket, monkeypatch):
    """A labels glob whose listing fails (no permission, a store that answers 5xx) names the
    store's answer: "no such file" would send the user looking for a typo."""
    import os

    from tests.gcs_emulator import FaultProxy

    gcs_bucket.blob("tables/part-1.csv").upload_from_string(b"id,label\nk1,a\n")
    proxy = FaultProxy(
        os.environ["STORAGE_EMULATOR_HOST"],
        lambda method, path, body: 403 if "/o?" in path or path.endswith("/o") else None,
    )
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{proxy.port}")
        with pytest.raises(TableError) as e:
            check_table(TableSpec(path="gs://labels-bkt/tables/part-*.csv", format="csv"))
    finally:
        proxy.close()
    assert "no such file" not in str(e.value) and "cannot list: Forbidden: 403 GET" in str(e.value)
