"""The gs:// listing fanned out by prefix (transforms/listing/gcs.py), against the GCS emulator.

A bucket of a few thousand small objects over many prefixes (images directly at the root, a
flat folder of 1,500 images, nesting deeper than the fan-out, folder placeholders, names with
glob characters, spaces, '#', '%', Unicode and '//'; listed in pages of 1,000 entries, as GCS
pages them, see tests/gcs_emulator.py) is listed by the real pipeline step and
compared with what one `MatchFiles(root/**)` lists: the same files, each exactly once, with
the fan-out cut at several depths. A conversion from the bucket gives byte for byte the
shards of a conversion of the same tree from a local folder.
"""

from __future__ import annotations

import collections
from pathlib import Path

import apache_beam as beam
import pytest
import requests
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_pipeline import main
from beam_pipeline.cli import checks
from tests.conftest import write_image
from tests.gcs_emulator import BUCKET, upload_tree
from transforms.gcs import first_page, split_gcs_path
from transforms.gcs import lister as gcs_lister
from transforms.listing import beam_gcs
from transforms.listing.beam import ListImages
from transforms.listing.gcs import BELOW, EXPAND, OBJECT, list_level
from transforms.paths import escape_glob, has_image_extension, relative_path

ROOT = f"gs://{BUCKET}/data"
FLAT = 1500  # images directly in one prefix
ODD_NAMES = [
    "data/a b/[x]*?.jpg",
    "data/a b/#1 100%.png",
    "data/서울/사진.jpeg",
    "data/double//slash.jpg",
    "data/UPPER.JPG",
    "data/c0/",  # a folder placeholder
    "data/c1/s0/",
    "data/root image.png",
    "data/readme.txt",
    "data/deep/1/2/3/4/5/6/far.gif",
    "data/deep/1/2/3/4/5/6/far.txt",
]
# Next to the root, not below it: never listed.
OUTSIDE = ["data.jpg", "data2/x.jpg", "other/data/y.jpg"]


def _names() -> list[str]:
    names = [
        f"data/c{c}/s{s}/{i:03d}.{'jpg' if i % 5 else 'txt'}"
        for c in range(30)
        for s in range(4)
        for i in range(12)
    ]
    names += [f"data/flat/{i:05d}.png" for i in range(FLAT)]
    return names + ODD_NAMES + OUTSIDE


def _upload(bucket, names: list[str]) -> None:
    """Small objects through one keep-alive session; the emulator takes ~5 ms an upload."""
    for name in names:
        bucket.blob(name).upload_from_string(name.encode("utf-8"))


@pytest.fixture(scope="module")
def bucket(gcs_bucket):
    _upload(gcs_bucket, _names())
    return gcs_bucket


def _expected(root: str = ROOT) -> list[tuple[str, str, int]]:
    """(path, relpath, size) of every image the old one-worker MatchFiles(root/**) lists."""
    found = FileSystems.match([escape_glob(root) + "/**"])[0].metadata_list
    return sorted(
        (m.path, relative_path(m.path, root), m.size_in_bytes) for m in found if has_image_extension(m.path)
    )


def _list(root: str, expected: list[tuple[str, str, int]]) -> int:
    """Checks that ListImages lists `expected`: (path, relpath, size) of every file, each once.
    Returns the number of prefixes the listing steps listed."""
    p = TestPipeline()
    files = (p | ListImages(root)).files
    listed = files | beam.FlatMap(lambda b: [(f.path, f.relpath, f.size) for f in b.files])

    def same_files_each_once(actual: list) -> None:
        actual = sorted(actual)
        if actual != expected:
            repeated = [f for f, n in collections.Counter(actual).items() if n > 1]
            raise BeamAssertException(
                f"listed {len(actual)}, expected {len(expected)}; repeated {repeated[:3]}, "
                f"missing {sorted(set(expected) - set(actual))[:3]}, extra {sorted(set(actual) - set(expected))[:3]}"
            )

    assert_that(listed, same_files_each_once)
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("prefixes_listed"))["counters"]
    return sum(c.committed for c in counters)


def test_many_prefixes_listed_in_parallel_give_the_same_files_each_once(bucket):
    expected = _expected()
    assert len(expected) == 30 * 4 * 9 + FLAT + 7  # 0, 5 and 10 are .txt
    names = {path.split("/", 3)[3] for path, _, _ in expected}
    assert "data/a b/[x]*?.jpg" in names and "data/double//slash.jpg" in names and "data.jpg" not in names

    prefixes = _list(ROOT, expected)
    # root, data/{a b,c0..c29,deep,double,flat,서울}/, their s0..s3 and deep/1/, then 2/ listed whole
    assert prefixes == 1 + 35 + 30 * 4 + 1 + 1 + 1


@pytest.mark.parametrize(
    "target, levels",
    [
        (1, 1),  # every top-level folder listed whole on its own
        (8, 3),  # the root has more than 8 folders: cut right below it
        (1000, 1),
        (100, 2),
    ],
)
def test_where_the_fanout_is_cut_changes_nothing(bucket, monkeypatch, target, levels):
    monkeypatch.setattr(beam_gcs, "FANOUT_TARGET", target)  # read by ListGcsImages
    monkeypatch.setattr(beam_gcs, "FANOUT_LEVELS", levels)
    prefixes = _list(ROOT, _expected())
    assert prefixes > 35


def test_the_whole_bucket_is_an_empty_prefix(gcs_bucket):
    client = gcs_bucket.client
    whole = client.create_bucket("img2tfrecord-whole")
    _upload(whole, ["top.jpg", "a/b.png", "a/", "a/c/d.jpg", "x.txt"])
    assert split_gcs_path("gs://img2tfrecord-whole") == ("img2tfrecord-whole", "")
    assert split_gcs_path("gs://img2tfrecord-whole/a/") == ("img2tfrecord-whole", "a/")
    expected = _expected("gs://img2tfrecord-whole")
    assert [relpath for _, relpath, _ in expected] == ["a/b.png", "a/c/d.jpg", "top.jpg"]
    assert _list("gs://img2tfrecord-whole", expected) == 1 + 2  # the root, a/ and a/c/


def test_list_level_holds_at_most_the_target_then_lists_the_rest_whole(bucket):
    lister = gcs_lister(BUCKET)
    entries = collections.defaultdict(list)
    for kind, value in list_level(lister, "data/", width=1, last_level=False, target=1000):
        entries[kind].append(value)
    assert [name for name, _ in entries[OBJECT]] == [
        "data/UPPER.JPG",
        "data/readme.txt",
        "data/root image.png",
    ]
    expand = [name for name, _ in entries[EXPAND]]
    assert len(expand) == 35 and "data/c0/" in expand and "data/double/" in expand and not entries[BELOW]
    assert {width for _, width in entries[EXPAND]} == {35}

    cut = collections.Counter(
        kind for kind, _ in list_level(lister, "data/", width=4, last_level=False, target=20)
    )
    assert cut == {OBJECT: 3, BELOW: 35}  # 5 held, then all passed on to be listed whole
    last = collections.Counter(kind for kind, _ in list_level(lister, "data/c0/", 40, last_level=True))
    assert last == {OBJECT: 1, BELOW: 4}  # the placeholder "data/c0/" is an object of its own prefix
    # Over pages (the emulator pages as GCS does, 1,000 entries a page).
    flat = [
        value[0] for kind, value in list_level(lister, "data/flat/", 1, last_level=False) if kind == OBJECT
    ]
    assert flat == [f"data/flat/{i:05d}.png" for i in range(FLAT)]


def test_an_unlistable_bucket_is_one_line(gcs_bucket):
    p = TestPipeline()
    _ = p | ListImages("gs://no-such-bucket/in")
    with pytest.raises(
        Exception, match="img2tfrecord-user-error: cannot list gs://no-such-bucket/in/: "
    ) as e:
        p.run().wait_until_finish()
    assert "404" in str(e.value).split("cannot list", 1)[1].splitlines()[0]


def _tree(root: Path) -> Path:
    for c, cls in enumerate(["cat", "dog house", "서울"]):
        for i in range(5):
            write_image(
                root / cls / ("deep/er" if i == 4 else "") / f"{i}.png", (8 + i, 6 + c), seed=10 * c + i
            )
    write_image(root / "at the root.jpg", (9, 9), fmt="JPEG", seed=99)
    return root


def test_a_bucket_converts_to_the_same_shards_as_a_local_copy(gcs_bucket, tmp_path, monkeypatch):
    tree = _tree(tmp_path / "tree")
    upload_tree(gcs_bucket, tree, "tree")  # the same name: dataset_info.json holds it
    args = [
        "--splits",
        "train=0.5,validation=0.5",
        "--num_shards",
        "2",
        "--quiet",
        "--max_failure_ratio",
        "0.5",
    ]
    local = main.run(
        ["--input", str(tree), "--output_dir", str(tmp_path / "local" / "out"), *args],
        save_main_session=False,
    )
    monkeypatch.setattr(beam_gcs, "FANOUT_TARGET", 2)  # cut right below the root (read by ListGcsImages)
    remote = main.run(
        ["--input", f"gs://{BUCKET}/tree", "--output_dir", str(tmp_path / "remote" / "out"), *args],
        save_main_session=False,
    )
    assert remote == local and remote["written"] == 15 and remote["failed"] == 1  # the root image: no class
    a, b = tmp_path / "local" / "out", tmp_path / "remote" / "out"
    shards = sorted(p.name for p in a.glob("*.tfrecord"))
    assert len(shards) == 4
    for name in [*shards, "labels.txt", "dataset_info.json"]:
        assert (b / name).read_bytes() == (a / name).read_bytes(), name


def test_the_cli_precheck_sends_one_list_request(bucket, monkeypatch):
    sent: list[str] = []
    send = requests.Session.send

    def counted(session, request, **kwargs):
        sent.append(request.url)
        return send(session, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", counted)
    checks.check_input(ROOT)  # ~3,000 objects below: one page of 1,000 is looked at
    # (The client may also fetch the bucket's metadata once, for its own cache.)
    lists = [url for url in sent if f"/b/{BUCKET}/o?" in url]
    assert len(lists) == 1 and "maxResults=1000" in lists[0] and "prefix=data%2F" in lists[0], sent
    assert len(first_page(ROOT, 1000)) == 1000 and first_page(f"gs://{BUCKET}/data/a b", 10) == [
        "data/a b/#1 100%.png",
        "data/a b/[x]*?.jpg",
    ]


@pytest.mark.parametrize("target", [2, 1000])  # classes listed whole; listed level by level
def test_a_bucket_counts_what_it_skips_as_a_local_folder_does(gcs_bucket, tmp_path, monkeypatch, target):
    """Hidden entries once each (a hidden prefix is not listed: below a prefix listed whole, its
    objects count once), other extensions by extension: the local walk's counts."""
    tree = tmp_path / "skips"
    for cls in ("cat", "dog"):
        write_image(tree / cls / "1.png", seed=1)
    for hidden in ("cat/.git/objects/ab/1.png", "cat/.git/HEAD", "dog/.DS_Store", ".cache/x.jpg", "._y.jpg"):
        (tree / hidden).parent.mkdir(parents=True, exist_ok=True)
        (tree / hidden).write_bytes(b"x")
    for other in ("dog/notes.txt", "dog/deep/er/more.TXT", "cat/meta.json", "README"):
        (tree / other).parent.mkdir(parents=True, exist_ok=True)
        (tree / other).write_bytes(b"x")
    prefix = f"skips{target}"
    upload_tree(gcs_bucket, tree, prefix)
    monkeypatch.setattr(beam_gcs, "FANOUT_TARGET", target)  # read by ListGcsImages
    summaries = [
        main.run(["--input", root, "--output_dir", str(tmp_path / name), "--quiet"], save_main_session=False)
        for name, root in (("local", str(tree)), ("remote", f"gs://{BUCKET}/{prefix}"))
    ]
    expected = {"total": 8, "hidden": 4, "by_extension": {".txt": 2, "(none)": 1, ".json": 1}}
    assert [s["skipped"] for s in summaries] == [expected, expected]
