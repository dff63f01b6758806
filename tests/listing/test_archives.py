"""Tar archives as input: indexing (pure), member reads, and whole runs compared with the
extracted folder (local, nested ImageNet-style, .tar.gz, damaged archives, gs://)."""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from transforms.images.read import ReadError, read_bytes
from transforms.layout.plan import shuffle_order, with_hashes
from transforms.listing.archives import Member, Problem, index_tar, source_name, unpacked_member
from transforms.listing.members import member_address, parse_address
from transforms.listing.webdataset import SampleLabel, label_samples, sidecar_label, webdataset_key
from transforms.paths import IMAGE_EXTENSIONS
from transforms.records import ImageRecord, RecordBatch


def _convert(args: list[str]) -> dict:
    return main.run(args + ["--quiet"], save_main_session=False)


def _tree(root: Path, classes=("cat", "dog"), per_class: int = 3, seed: int = 0) -> Path:
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_image(root / name / f"{i}.jpg", (12 + i, 10), seed=seed + 10 * c + i, fmt="JPEG")
    return root


def _tar(path: Path, folder: Path, mode: str = "w", arcname: str = ".") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as t:
        t.add(folder, arcname=arcname)
    return path


def _examples(out: Path) -> list[tuple[str, bytes]]:
    """(image/filename, the Example without image/filename) of every record, in shard order."""
    import tensorflow as tf

    found = []
    for shard in sorted(glob.glob(str(out / "*-of-*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(shard):
            example = tf.train.Example.FromString(raw.numpy())
            name = example.features.feature["image/filename"].bytes_list.value[0].decode()
            del example.features.feature["image/filename"]
            found.append((os.path.basename(shard), name, example.SerializeToString(deterministic=True)))
    return [(name, (shard, rest)) for shard, name, rest in found]


def _counts(summary: dict) -> dict:
    """The summary without byte counts (image/filename differs in length)."""
    splits = {k: {n: v for n, v in s.items() if n != "bytes"} for k, s in summary["splits"].items()}
    return {**summary, "splits": splits}


def _failures(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]


# --- pure: addresses and indexing ---------------------------------------------------------


def test_address_round_trip_and_plain_paths():
    address = member_address("/d/a#b.tar", "x.tar#y@1+2.jpg", 1536, 20)
    parsed = parse_address(address)
    assert (parsed.archive, parsed.member, parsed.offset, parsed.size) == (
        "/d/a#b.tar",
        "x.tar#y@1+2.jpg",
        1536,
        20,
    )
    assert parse_address("gs://b/p/images_000.TAR#a/b.jpg@0+5").archive == "gs://b/p/images_000.TAR"
    for plain in ("/d/cat/a.jpg", "/d/c#t/a.jpg", "/d/x.tar#a.jpg", "gs://b/x.tgz#1.png"):
        assert parse_address(plain) is None


def test_names_as_if_unpacked():
    assert unpacked_member("./cat/1.jpg") == "cat/1.jpg"
    assert unpacked_member("/abs/1.jpg") == "abs/1.jpg"
    assert unpacked_member("../up/1.jpg") == "../up/1.jpg"  # only a name: nothing is extracted
    assert unpacked_member("n01440764.tar#n01440764_1.JPEG") == "n01440764/n01440764_1.JPEG"
    address = member_address("/d/train/a.tar", "./cat/1.jpg", 512, 3)
    assert source_name(address, "train/cat/1.jpg") == "train/a.tar#./cat/1.jpg"
    assert source_name("/d/cat/1.jpg", "cat/1.jpg") == "cat/1.jpg"


def test_index_tar_lists_members_and_names_what_it_cannot(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:

        def add(name: str, data: bytes = b"", **kind) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in kind.items():
                setattr(info, k, v)
            t.addfile(info, io.BytesIO(data))

        add("cat", type=tarfile.DIRTYPE)
        add("cat/1.jpg", b"one")
        add("cat/notes.txt", b"text")
        add("cat/link.jpg", type=tarfile.SYMTYPE, linkname="1.jpg")
        add("cat/hard.png", type=tarfile.LNKTYPE, linkname="cat/1.jpg")
        add("cat/dev.gif", type=tarfile.CHRTYPE)
        add("../up/2.png", b"two")
        add("/abs/3.gif", b"three")
        add("x" * 150 + "/4.jpg", b"four")  # a long (GNU/pax) name
    data = buf.getvalue()
    items = list(index_tar(io.BytesIO(data), len(data), IMAGE_EXTENSIONS, folder="sub/"))
    members = [i for i in items if isinstance(i, Member)]
    problems = [i for i in items if isinstance(i, Problem)]
    assert [m.relpath for m in members] == [
        "sub/cat/1.jpg",
        "sub/../up/2.png",
        "sub/abs/3.gif",
        "sub/" + "x" * 150 + "/4.jpg",
    ]
    assert [data[m.offset : m.offset + m.size] for m in members] == [b"one", b"two", b"three", b"four"]
    assert [(p.name, p.reason) for p in problems] == [
        ("cat/link.jpg", "not a regular file (symbolic link to '1.jpg')"),
        ("cat/hard.png", "not a regular file (hard link to 'cat/1.jpg')"),
        ("cat/dev.gif", "not a regular file (device)"),
    ]


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_index_tar_damaged_archives():
    data = _tar_bytes({"a/1.jpg": b"1" * 700, "a/2.jpg": b"2" * 700, "a/3.jpg": b"3" * 700})
    offsets = [m.offset for m in index_tar(io.BytesIO(data), len(data), IMAGE_EXTENSIONS)]

    def index(blob: bytes) -> list:
        return list(index_tar(io.BytesIO(blob), len(blob), IMAGE_EXTENSIONS))

    cut = index(data[: offsets[1] + 100])  # inside the second member's data
    assert [type(i).__name__ for i in cut] == ["Member", "Problem"]
    assert cut[1].name == "a/2.jpg" and cut[1].reason.startswith("archive truncated")

    no_end = index(data[: offsets[2] + 1024])  # after the last member, without the end marker
    assert [type(i).__name__ for i in no_end] == ["Member", "Member", "Member", "Problem"]
    assert no_end[-1].name == "" and "no end-of-archive marker" in no_end[-1].reason

    in_header = index(data[: offsets[1] - 200])
    assert isinstance(in_header[-1], Problem) and "truncated inside a header" in in_header[-1].reason

    damaged = bytearray(data)
    damaged[offsets[1] - 512 : offsets[1] - 412] = b"\x7f" * 100  # the second header
    broken = index(bytes(damaged))
    # As GNU tar: "Skipping to next header", and the members after it are listed.
    assert [type(i).__name__ for i in broken] == ["Member", "Problem", "Member"]
    assert broken[1].reason == (
        f"damaged tar header at byte {offsets[1] - 512}: {offsets[2] - offsets[1]} bytes skipped "
        f"to the next header at byte {offsets[2] - 512}"
    )
    assert broken[2] == index(data)[2]

    assert [i.reason.split(" (")[0] for i in index(b"not a tar at all" * 64)] == [
        "not a readable tar archive"
    ]


def test_read_member_by_offset_local(tmp_path):
    data = _tar_bytes({"a/1.jpg": b"payload"})
    (tmp_path / "a.tar").write_bytes(data)
    (member,) = index_tar(io.BytesIO(data), len(data), IMAGE_EXTENSIONS)
    address = member_address(str(tmp_path / "a.tar"), member.name, member.offset, member.size)
    assert read_bytes(address) == b"payload"
    (tmp_path / "a.tar").write_bytes(data[: member.offset + 3])  # truncated after listing
    with pytest.raises(ReadError, match="archive truncated: 3 of the member's 7 bytes"):
        read_bytes(address)
    os.remove(tmp_path / "a.tar")
    with pytest.raises(ReadError, match="disappeared"):
        read_bytes(address)


def test_shuffle_order_does_not_depend_on_arrival_when_relpaths_tie():
    # Two archives holding the same member path: same relpath, different addresses.
    a = ImageRecord(member_address("/d/a.tar", "cat/1.jpg", 512, 3), "cat/1.jpg", 3)
    b = ImageRecord(member_address("/d/b.tar", "cat/1.jpg", 512, 3), "cat/1.jpg", 3)
    ab, ba = with_hashes(RecordBatch((a, b)), 7), with_hashes(RecordBatch((b, a)), 7)
    assert [ab.records[i] for i in shuffle_order(ab)] == [ba.records[i] for i in shuffle_order(ba)]


def test_webdataset_keys_and_sidecars():
    assert webdataset_key("a/b.c.JPG") == ("a/b", "c.jpg")  # key: up to the first dot of the name
    assert webdataset_key("x.y/000123.cls") == ("x.y/000123", "cls")
    assert sidecar_label("cls", b" 7\n") == "7"
    assert sidecar_label("json", b'{"cls": 3, "label": "cat"}') == "cat"
    assert sidecar_label("json", b"[1, 2]") == [1, 2]
    with pytest.raises(ValueError, match="no label/cls/class field"):
        sidecar_label("json", b'{"caption": "a cat"}')
    with pytest.raises(UnicodeDecodeError):
        sidecar_label("txt", b"\xff")


def test_label_samples_pairs_each_image_with_its_own_sample():
    data = {"a.txt": b"caption a", "a.cls": b"1", "b.cls": b"2"}
    members = [
        Member("a.jpg", "a.jpg", 0, 1),
        Member("a.txt", "a.txt", 1, 1),
        Member("a.cls", "a.cls", 2, 1),  # .cls wins over .txt
        Member("b.cls", "b.cls", 3, 1),  # sidecar before the image
        Member("b.png", "b.png", 4, 1),
        Member("c.jpg", "c.jpg", 5, 1),  # no sidecar
        Problem("d.jpg", "not a regular file (fifo)"),
    ]
    out = list(label_samples(iter(members), lambda m: data[m.name], (".jpg", ".png")))
    assert out == [
        members[0],
        SampleLabel("a.jpg", "1", "a.cls"),
        members[4],
        SampleLabel("b.png", "2", "b.cls"),
        members[6],
        members[5],
    ]


# --- whole runs -------------------------------------------------------------------------


def test_tar_converts_like_the_extracted_folder(tmp_path):
    folder = _tree(tmp_path / "folder")
    (folder / "cat" / "notes.txt").write_text("not an image")
    archive = _tar(tmp_path / "in" / "a.tar", folder)
    args = ["--splits", "train=0.5,validation=0.5", "--shard_size_mb", "0.001"]
    from_folder = _convert(["--input", str(folder), "--output_dir", str(tmp_path / "o1"), *args])
    from_tar = _convert(["--input", str(archive), "--output_dir", str(tmp_path / "o2"), *args])

    assert _counts(from_tar) == _counts(from_folder) and from_tar["listed"] == 6 == from_tar["written"]
    folder_examples, tar_examples = _examples(tmp_path / "o1"), _examples(tmp_path / "o2")
    # Same shards, same records in the same order, the same bytes but for image/filename,
    # which names the archive and the member as it is stored there.
    assert [f"a.tar#./{name}" for name, _ in folder_examples] == [name for name, _ in tar_examples]
    assert [rest for _, rest in folder_examples] == [rest for _, rest in tar_examples]


def test_folder_of_archives_and_images_two_archives_same_member(tmp_path):
    inp = tmp_path / "in"
    _tar(inp / "part1.tar", _tree(tmp_path / "p1", seed=0))
    _tar(inp / "part2.tar", _tree(tmp_path / "p2", seed=100))  # the same member paths
    write_image(inp / "cat" / "loose.jpg", seed=7, fmt="JPEG")  # a plain file next to them
    out = tmp_path / "out"
    summary = _convert(["--input", str(inp), "--output_dir", str(out)])
    assert summary["listed"] == 13 == summary["written"]
    assert summary["written_per_class"] == {"cat": 7, "dog": 6}
    names = [name for name, _ in _examples(out)]
    assert len(set(names)) == 13 and "part1.tar#./cat/0.jpg" in names and "part2.tar#./cat/0.jpg" in names
    # Deterministic: a rerun gives the same bytes.
    _convert(["--input", str(inp), "--output_dir", str(tmp_path / "again")])
    assert (out / "train-00000-of-00001.tfrecord").read_bytes() == (
        tmp_path / "again" / "train-00000-of-00001.tfrecord"
    ).read_bytes()


def test_imagenet_style_nested_tars_label_by_inner_stem(tmp_path):
    classes = ("n01440764", "n01443537")
    folder = tmp_path / "folder"
    outer = tmp_path / "in" / "ILSVRC2012_img_train.tar"
    outer.parent.mkdir()
    with tarfile.open(outer, "w") as t:
        for c, wnid in enumerate(classes):
            for i in range(3):
                write_image(folder / wnid / f"{wnid}_{i}.JPEG", (10 + i, 9), seed=c * 10 + i, fmt="JPEG")
            inner = _tar(tmp_path / f"{wnid}.tar", folder / wnid, arcname="")
            t.add(inner, arcname=f"{wnid}.tar")
    args = ["--splits", "train=0.7,validation=0.3"]
    from_folder = _convert(["--input", str(folder), "--output_dir", str(tmp_path / "o1"), *args])
    from_tar = _convert(["--input", str(outer), "--output_dir", str(tmp_path / "o2"), *args])
    assert _counts(from_tar) == _counts(from_folder) and (
        tmp_path / "o2" / "labels.txt"
    ).read_text().split() == list(classes)
    folder_examples, tar_examples = _examples(tmp_path / "o1"), _examples(tmp_path / "o2")
    expected = [
        f"ILSVRC2012_img_train.tar#{n.split('/')[0]}.tar#{n.split('/')[1]}" for n, _ in folder_examples
    ]
    assert [name for name, _ in tar_examples] == expected
    assert [rest for _, rest in folder_examples] == [rest for _, rest in tar_examples]


def test_tar_gz_is_decompressed_once_into_the_temp_folder(tmp_path):
    folder = _tree(tmp_path / "folder")
    _tar(tmp_path / "in" / "a.tgz", folder, mode="w:gz")
    from_folder = _convert(["--input", str(folder), "--output_dir", str(tmp_path / "o1")])
    from_tgz = _convert(["--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "o2")])
    assert _counts(from_tgz) == _counts(from_folder)
    assert [f"a.tgz#./{n}" for n, _ in _examples(tmp_path / "o1")] == [
        n for n, _ in _examples(tmp_path / "o2")
    ]
    assert [r for _, r in _examples(tmp_path / "o1")] == [r for _, r in _examples(tmp_path / "o2")]
    assert not [p for p in os.listdir(tmp_path / "o2") if p.startswith("beam-temp")]  # copy deleted


def test_damaged_archives_fail_by_name_and_the_rest_is_written(tmp_path):
    inp = tmp_path / "in"
    _tree(tmp_path / "good")
    _tar(inp / "good.tar", tmp_path / "good")
    data = _tar_bytes(
        {f"cat/{i}.jpg": (tmp_path / "good" / "cat" / f"{i}.jpg").read_bytes() for i in range(3)}
    )
    second = [m.offset for m in index_tar(io.BytesIO(data), len(data), IMAGE_EXTENSIONS)][1]
    (inp / "cut.tar").write_bytes(data[: second + 10])  # truncated inside cat/1.jpg
    gz = gzip.compress(data)
    (inp / "cut.tar.gz").write_bytes(gz[: len(gz) // 2])  # a gzip stream cut short
    (inp / "empty.tar").write_bytes(b"")
    os.mkfifo(inp / "pipe.tar")  # refused, never waited on
    with tarfile.open(inp / "links.tar", "w") as t:
        info = tarfile.TarInfo("cat/link.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    out = tmp_path / "out"
    summary = _convert(["--input", str(inp), "--output_dir", str(out), "--max_failure_ratio", "1"])
    assert summary["listed"] == summary["written"] + summary["failed"]
    failures = {f["path"].replace(str(inp) + "/", ""): f for f in _failures(out)}
    assert failures["cut.tar#cat/1.jpg"]["reason"].startswith("archive truncated")
    assert failures["cut.tar#cat/1.jpg"]["stage"] == "list"
    assert "not a readable tar archive" in failures["empty.tar"]["reason"]
    assert failures["pipe.tar"]["reason"] == "cannot read the archive (not a regular file)"
    assert (
        failures["links.tar#cat/link.jpg"]["reason"] == "not a regular file (symbolic link to '/etc/passwd')"
    )
    assert failures["cut.tar.gz"]["reason"].startswith("gzip data cut short after ")
    written = {name for name, _ in _examples(out)}
    assert {"cut.tar#cat/0.jpg", "good.tar#./dog/2.jpg"} <= written
    assert summary["written"] == 6 + 1 + sum(n.startswith("cut.tar.gz#") for n in written)


def test_missing_archive_is_a_one_line_error(tmp_path, capsys):
    assert main.main(["--input", str(tmp_path / "nothing-*.tar"), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("no such archive") and len(err.splitlines()) == 1


def test_tar_on_gcs_matches_local(gcs_bucket, tmp_path):
    from tests.gcs_emulator import BUCKET

    folder = _tree(tmp_path / "folder")
    _tar(tmp_path / "a.tar", folder)
    gcs_bucket.blob("tars/shards/a.tar").upload_from_filename(str(tmp_path / "a.tar"))
    gcs_bucket.blob("tars/shards/b.tar").upload_from_filename(str(tmp_path / "a.tar"))
    local = _convert(["--input", str(tmp_path / "a.tar"), "--output_dir", str(tmp_path / "o1")])
    one = _convert(["--input", f"gs://{BUCKET}/tars/shards/a.tar", "--output_dir", str(tmp_path / "o2")])
    assert one == local
    assert _examples(tmp_path / "o1") == _examples(tmp_path / "o2")
    both = _convert(["--input", f"gs://{BUCKET}/tars/shards/*.tar", "--output_dir", str(tmp_path / "o3")])
    prefix = _convert(["--input", f"gs://{BUCKET}/tars", "--output_dir", str(tmp_path / "o4")])
    assert both["written"] == 12 and prefix["written"] == 12
    assert {n for n, _ in _examples(tmp_path / "o4")} == {
        f"shards/{n}" for n, _ in _examples(tmp_path / "o3")
    }


def test_webdataset_sidecars_label_their_sample(tmp_path):
    files = {}
    for i in range(1, 6):
        image = write_image(tmp_path / "img" / f"{i}.jpg", (9 + i, 8), seed=i, fmt="JPEG")
        files[f"train/s{i:04d}.{'png' if i == 5 else 'jpg'}"] = image.read_bytes()
        sidecar = {
            1: ("cls", b"cat\n"),
            2: ("txt", b"dog"),
            3: ("json", b'{"label": "cat"}'),
            5: ("json", b"{"),
        }
        if i in sidecar:
            ext, data = sidecar[i]
            files[f"train/s{i:04d}.{ext}"] = data
    (tmp_path / "wds").mkdir()
    (tmp_path / "wds" / "shard-000000.tar").write_bytes(_tar_bytes(files))
    out = tmp_path / "out"
    summary = _convert(
        [
            "--input",
            str(tmp_path / "wds"),
            "--output_dir",
            str(out),
            "--labels",
            "webdataset",
            "--max_failure_ratio",
            "1",
        ]
    )
    assert (summary["listed"], summary["written"], summary["failed"]) == (5, 3, 2)
    assert summary["written_per_class"] == {"cat": 2, "dog": 1}
    written = {name: rest for name, rest in _examples(out)}
    assert set(written) == {f"shard-000000.tar#train/s000{i}.jpg" for i in (1, 2, 3)}
    reasons = {f["path"].rsplit("#", 1)[-1].split("@")[0]: f["reason"] for f in _failures(out)}
    assert reasons["train/s0005.png"].startswith("label sidecar train/s0005.json: ")
    assert reasons["train/s0004.jpg"].startswith("label missing")  # --unlabeled fail


def test_tar_gz_on_gcs_is_copied_to_the_bucket_temp_folder(gcs_bucket, tmp_path):
    from tests.gcs_emulator import BUCKET, download_prefix

    folder = _tree(tmp_path / "folder", per_class=2)
    _tar(tmp_path / "a.tar.gz", folder, mode="w:gz")
    gcs_bucket.blob("tgz/a.tar.gz").upload_from_filename(str(tmp_path / "a.tar.gz"))
    summary = _convert(["--input", f"gs://{BUCKET}/tgz/a.tar.gz", "--output_dir", f"gs://{BUCKET}/tgz-out"])
    assert summary["written"] == 4 == summary["listed"]
    names = download_prefix(gcs_bucket, "tgz-out", tmp_path / "out")
    assert not [n for n in names if "beam-temp" in n]  # the uncompressed copy went with the temp folder
    assert sorted(n for n, _ in _examples(tmp_path / "out")) == sorted(
        f"a.tar.gz#./{c}/{i}.jpg" for c in ("cat", "dog") for i in range(2)
    )


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_header_parse_agrees_with_tarfile(fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        names = ["a/1.jpg", "b/" * 60 + "x.jpg", "dir/"]  # a ustar prefix, a folder
        if fmt != tarfile.USTAR_FORMAT:  # long names and links, non-ASCII: GNU or pax headers
            names += ["d/" * 70 + "long.jpg", "서울/é.png", "e/" * 70 + "sym.jpg"]
        for name in names:
            info, data = tarfile.TarInfo(name), name.encode()
            if name.endswith("/"):
                info.type, data = tarfile.DIRTYPE, b""
            if "sym" in name:
                info.type, info.linkname, data = tarfile.SYMTYPE, "q/" * 80, b""
            info.size, info.mtime = len(data), 1.5 if fmt == tarfile.PAX_FORMAT else 1  # a pax mtime
            t.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    fast = list(index_tar(io.BytesIO(data), len(data), IMAGE_EXTENSIONS))
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        slow = [
            (i.name, i.offset_data, i.size) if i.isreg() else i.name
            for i in t.getmembers()
            if i.name.endswith((".jpg", ".png"))
        ]
    assert [(m.name, m.offset, m.size) if isinstance(m, Member) else m.name for m in fast] == slow and len(
        fast
    ) == len(names) - 1


def test_dedupe_reads_members_and_drops_the_copies(tmp_path):
    inp = tmp_path / "in"
    _tree(tmp_path / "tree", per_class=2)
    _tar(inp / "a.tar", tmp_path / "tree")
    _tar(inp / "b.tar", tmp_path / "tree")  # the same images again
    out = tmp_path / "out"
    summary = _convert(
        ["--input", str(inp), "--output_dir", str(out), "--dedupe", "--max_failure_ratio", "0.5"]
    )
    assert (summary["listed"], summary["written"], summary["duplicates"]) == (8, 4, 4)
    assert {n.split("#")[0] for n, _ in _examples(out)} == {"a.tar"}  # the smallest path is kept
