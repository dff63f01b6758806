"""Labels from a table, end to end: the Dacon layout, read back with TensorFlow."""

import json
import os

import pytest

from beam_pipeline import main
from tests.conftest import METADATA_FILES, read_records, write_image

# Dacon landmark layout: train/<city>/<landmark>/<id>.JPG, labels in train.csv (id,landmark_id).
_DACON = {
    "서울특별시/경복궁": ["SE_0001", "SE_0002", "SE_0003"],
    "서울특별시/남산타워": ["SE_0101", "SE_0102"],
    "부산광역시/해운대": ["BU_0001", "BU_0002", "BU_0003"],
}
_LANDMARK_ID = {"서울특별시/경복궁": 0, "서울특별시/남산타워": 2, "부산광역시/해운대": 5}


@pytest.fixture(scope="module")
def dacon(tmp_path_factory):
    root = tmp_path_factory.mktemp("dacon")
    train = root / "train"
    seed = 0
    for folder, ids in _DACON.items():
        for image_id in ids:
            seed += 1
            write_image(train / folder / f"{image_id}.JPG", (20 + seed, 16), seed=seed, fmt="JPEG")
    # Two images without a row.
    write_image(train / "부산광역시" / "해운대" / "BU_9998.JPG", (8, 8), seed=98, fmt="JPEG")
    write_image(train / "서울특별시" / "경복궁" / "SE_9999.JPG", (8, 8), seed=99, fmt="JPEG")
    lines = ["id,landmark_id"]
    for folder, ids in _DACON.items():
        lines += [f"{image_id},{_LANDMARK_ID[folder]}" for image_id in ids]
    lines += ["SE_0002,0"]  # a duplicate that agrees: merged
    lines += ["BU_0003,2"]  # a duplicate that conflicts: BU_0003 fails
    lines += ["XX_0001,3", '"XX_0002",4']  # orphan rows (the second quoted)
    (root / "train.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _convert(args):
    return main.run(args + ["--quiet", "--max_failure_ratio", "1"], save_main_session=False)


def test_dacon_csv_end_to_end(dacon, tmp_path):
    out = tmp_path / "out"
    summary = _convert(
        [
            "--input",
            str(dacon / "train"),
            "--labels",
            str(dacon / "train.csv"),
            "--label_column",
            "landmark_id",
            "--output_dir",
            str(out),
            # Airflow's Beam operator appends job labels; they must stay Beam's.
            "--labels=airflow-version=v3-0-0",
        ]
    )
    assert summary["listed"] == 10 and summary["written"] == 7 and summary["failed"] == 3
    assert summary["listed"] == summary["written"] + summary["failed"]
    labels = summary["labels"]
    assert labels["rows"] == 12 and labels["orphan_rows"] == 2 and labels["matched_rows"] == 10
    assert labels["duplicate_keys"] == 2 and labels["conflicting_keys"] == 1
    assert labels["unlabeled_images"] == 2 and labels["invalid_rows"] == 0

    failures = {
        json.loads(x)["path"].rsplit("/", 1)[1]: json.loads(x) for x in (out / "failures.jsonl").open()
    }
    assert set(failures) == {"BU_9998.JPG", "SE_9999.JPG", "BU_0003.JPG"}
    assert all(f["stage"] == "label" for f in failures.values())
    assert "label missing" in failures["SE_9999.JPG"]["reason"]
    assert "conflicting rows" in failures["BU_0003.JPG"]["reason"]

    orphans = [json.loads(x) for x in (out / "orphan_labels.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(o["key"] for o in orphans) == ["XX_0001", "XX_0002"]
    assert all(o["reason"] == "no image with this key" and o["line"] in (12, 13) for o in orphans)

    # Integer labels are the ids as given; labels.txt lists every id up to the largest.
    assert (out / "labels.txt").read_text().split() == ["0", "1", "2", "3", "4", "5"]
    records = read_records(out)
    assert len(records) == 7
    for r in records:
        folder = r["filename"].rsplit("/", 1)[0]
        assert r["label"] == [_LANDMARK_ID[folder]], r["filename"]
        assert r["text"] == [str(_LANDMARK_ID[folder])]
        assert r["encoded"] == (dacon / "train" / r["filename"]).read_bytes()
    assert {r["filename"] for r in records} >= {
        "서울특별시/경복궁/SE_0001.JPG",
        "부산광역시/해운대/BU_0001.JPG",
    }


def _read_extras(out, split, spec_extra):
    import glob
    import os

    import tensorflow as tf

    shards = sorted(glob.glob(os.path.join(str(out), f"{split}-*-of-*.tfrecord")))
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string), **spec_extra}
    return [tf.io.parse_single_example(raw, spec) for raw in tf.data.TFRecordDataset(shards)]


def test_jsonl_multilabel_extras_split_column_label_map_keep(tmp_path):
    import tensorflow as tf

    images = tmp_path / "imgs"
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        write_image(images / "sub" / f"{name}.png", (10 + i, 10), seed=i)
    rows = [
        {"file": "sub/a.png", "tags": "고양이|dog", "part": "train", "weight": 0.5, "source": "web"},
        {"file": "sub/b.png", "tags": ["dog"], "part": "validation", "weight": 2, "source": "cam"},
        {"file": "sub/c.png", "tags": "bird", "part": "train", "weight": 1, "source": "x"},  # not in map
        {"file": "sub/d.png", "tags": "dog", "part": "train", "weight": "heavy", "source": "x"},  # bad float
        {"file": "sub/zz.png", "tags": "dog", "part": "train", "weight": 1, "source": "x"},  # orphan
    ]
    table = tmp_path / "labels.jsonl"
    table.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "map.txt").write_text("dog\n고양이\n", encoding="utf-8")
    out = tmp_path / "out"
    summary = _convert(
        [
            "--input",
            str(images),
            f"--labels={table}",
            "--image_key",
            "relpath",
            "--key_column",
            "file",
            "--label_column",
            "tags",
            "--split_column",
            "part",
            "--extra_columns",
            "weight:float,source:str",
            "--label_map",
            str(tmp_path / "map.txt"),
            "--label_offset",
            "1",
            "--unlabeled",
            "keep",
            "--output_dir",
            str(out),
        ]
    )
    assert summary["listed"] == 5 and summary["written"] == 3 and summary["failed"] == 2
    assert summary["labels"]["unlabeled_kept"] == 1 and summary["labels"]["orphan_rows"] == 1
    assert summary["labels"]["invalid_rows"] == 1
    assert summary["splits"]["train"]["written"] == 2 and summary["splits"]["validation"]["written"] == 1
    assert (out / "labels.txt").read_text(encoding="utf-8").split() == ["dog", "고양이"]
    reasons = {
        json.loads(x)["path"].rsplit("/", 1)[1]: json.loads(x)["reason"]
        for x in (out / "failures.jsonl").open()
    }
    assert "not in --label_map" in reasons["c.png"] and "not a float" in reasons["d.png"]

    train = {r["filename"]: r for r in read_records(out, "train")}
    assert train["sub/a.png"]["label"] == [2, 1] and train["sub/a.png"]["text"] == ["고양이", "dog"]
    assert train["sub/e.png"]["label"] == [] and train["sub/e.png"]["text"] == []  # kept unlabeled
    assert [r["label"] for r in read_records(out, "validation")] == [[1]]
    extras = {
        "weight": tf.io.FixedLenFeature([], tf.float32),
        "source": tf.io.FixedLenFeature([], tf.string),
    }
    parsed = {e["image/filename"].numpy().decode(): e for e in _read_extras(out, "validation", extras)}
    assert float(parsed["sub/b.png"]["weight"]) == 2.0 and parsed["sub/b.png"]["source"].numpy() == b"cam"


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--labels", "{tmp}/t.csv", "--label_column", "landmark"],
            "no column 'landmark' (columns: id, label); name the label column with --label_column label",
        ),
        # The cause and the fix: the table's key column is not the default 'id'.
        (
            ["--labels", "{tmp}/files.csv"],
            "no column 'id' (columns: filename, label); name the key column with --key_column filename",
        ),
        (
            ["--labels", "{tmp}/files.jsonl"],
            "no field 'id' (fields: filename, label); name the key column with --key_column filename",
        ),
        (["--labels", "{tmp}/missing.csv"], "no such file"),
        (["--labels", "{tmp}/t*.csv"], "t2.csv has no column 'label'"),  # found inside the pipeline
        (["--labels", "{tmp}/t.txt"], "--labels_format"),
        (["--labels", "{tmp}/t.csv", "--extra_columns", "w:double"], "--extra_columns"),
        (["--labels", "{tmp}/t.csv", "--label_map", "{tmp}/nomap.txt"], "--label_map"),
        (["--label_map", "{tmp}/t.csv"], "needs --labels"),
        (["--labels", "{tmp}/t.csv", "--split_column", "label", "--splits", "a=1"], "exclusive"),
        # Found inside the pipeline, past the header:
        (["--labels", "{tmp}/open.csv"], 'open.csv line 3: a quoted field is never closed (a missing "'),
        (["--labels", "{tmp}/huge.csv"], "huge.csv line 2: field larger than field limit (131072)"),
        # Not UTF-8, another delimiter, a line over the cap: named with the fix, before the run.
        (["--labels", "{tmp}/cp949.csv"], "cp949.csv line 2 is not UTF-8: it looks like CP949/EUC-KR"),
        (["--labels", "{tmp}/cp949.csv"], "or pass --labels_encoding cp949"),
        (["--labels", "{tmp}/utf16.csv"], "utf16.csv line 1 is not UTF-8: it looks like UTF-16 (it starts"),
        (["--labels", "{tmp}/latin1.csv"], "latin1.csv line 3 is not UTF-8: it looks like Windows-1252"),
        (
            ["--labels", "{tmp}/semi.csv"],
            "its header has no ',' but ';' between names: pass --labels_delimiter ';'",
        ),
        (
            ["--labels", "{tmp}/tab.csv"],
            "its header has no ',' but a tab between names: pass --labels_format tsv",
        ),
        (["--labels", "{tmp}/long.jsonl"], "long.jsonl line 2 is over 4 MiB"),
        (["--labels", "{tmp}/late.csv"], "late.csv line 200003 is not UTF-8"),  # found inside the pipeline
        (["--labels", "{tmp}/fifo.csv"], "fifo.csv is not a regular file (a pipe or a device)"),
    ],
)
def test_label_table_user_errors(tmp_path, capsys, extra, message):
    write_image(tmp_path / "imgs" / "x.png")
    (tmp_path / "t.csv").write_text("id,label\nx,cat\n")
    (tmp_path / "open.csv").write_text('id,label\nx,cat\ny,"dog\nz,ant\n')
    (tmp_path / "huge.csv").write_text("id,label\nx," + "c" * 200_000 + "\n")
    (tmp_path / "cp949.csv").write_bytes("id,label\nx,경복궁\n".encode("cp949"))
    (tmp_path / "utf16.csv").write_bytes("id,label\nx,cat\n".encode("utf-16"))
    (tmp_path / "latin1.csv").write_bytes("id,label\nx,cat\ny,café\n".encode("latin-1"))
    (tmp_path / "semi.csv").write_text("id;landmark_id\nx;1\n")
    (tmp_path / "tab.csv").write_text("id\tlabel\nx\tcat\n")
    (tmp_path / "long.jsonl").write_bytes(
        b'{"id": "x", "label": "cat"}\n{"id": "y", "label": "' + b"c" * (5 << 20) + b'"}\n'
    )
    (tmp_path / "late.csv").write_bytes(
        ("id,label\nx,cat\n" + "y,dog\n" * 200_000).encode() + "z,café\n".encode("latin-1")
    )
    os.mkfifo(tmp_path / "fifo.csv")  # as `--labels <(zcat t.csv.gz)` gives: a pipe
    (tmp_path / "t.txt").write_text("id,label\nx,cat\n")
    (tmp_path / "t2.csv").write_text("id,class\nx,cat\n")
    (tmp_path / "files.csv").write_text("filename,label\nx.png,cat\n")
    (tmp_path / "files.jsonl").write_text('{"filename": "x.png", "label": "cat"}\n')
    argv = ["--input", str(tmp_path / "imgs"), "--output_dir", str(tmp_path / "o")]
    argv += [a.format(tmp=tmp_path) for a in extra]
    assert main.main(argv + ["--quiet"]) == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_tsv_skip_union_split_folders_no_orphans(tmp_path):
    images = tmp_path / "imgs"
    write_image(images / "train" / "x" / "a.png", seed=1)
    write_image(images / "train" / "y" / "b.png", seed=2)
    write_image(images / "test" / "c.png", seed=3)
    write_image(images / "test" / "unlabeled.png", seed=4)
    rows = ["name\tlabel", "a.png\tcat", "a.png\tdog", "b.png\tdog", 'c.png\t"cat|bird"']
    (tmp_path / "labels.tsv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    summary = _convert(
        [
            "--input",
            str(images),
            "--labels",
            str(tmp_path / "labels.tsv"),
            "--key_column",
            "name",
            "--image_key",
            "name",
            "--unlabeled",
            "skip",
            "--duplicate_keys",
            "union",
            "--splits",
            "folders",
            "--output_dir",
            str(out),
        ]
    )
    # The skipped image is counted under "labels", not listed: listed == written + failed holds.
    assert summary["listed"] == 3 and summary["written"] == 3 and summary["failed"] == 0
    assert summary["labels"]["unlabeled_skipped"] == 1 and summary["labels"]["orphan_rows"] == 0
    assert summary["labels"]["duplicate_keys"] == 1 and summary["labels"]["conflicting_keys"] == 0
    assert (out / "labels.txt").read_text().split() == ["bird", "cat", "dog"]
    train = {r["filename"]: r for r in read_records(out, "train")}
    assert train["train/x/a.png"]["text"] == ["cat", "dog"] and train["train/x/a.png"]["label"] == [1, 2]
    assert [r["label"] for r in read_records(out, "test")] == [[1, 0]]
    assert (out / "orphan_labels.jsonl").read_text() == ""
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tfrecord")) == sorted(
        METADATA_FILES + ["orphan_labels.jsonl"]
    )


def test_undecodable_file_name_with_a_table_is_a_named_failure(tmp_path):
    # The join key of "bad\xff.jpg" is not UTF-8 text: it is shuffled as bytes, not a crash.
    write_image(tmp_path / "in" / "cat" / "ok.jpg", (8, 8), seed=1)
    write_image(tmp_path / "in" / "cat" / "bad\udcff.jpg", (8, 8), seed=2)
    (tmp_path / "labels.csv").write_text("id,label\nok,cat\n")
    out = tmp_path / "out"
    summary = _convert(
        ["--input", str(tmp_path / "in"), "--labels", str(tmp_path / "labels.csv")]
        + ["--output_dir", str(out)]
    )
    assert (summary["listed"], summary["written"], summary["failed"]) == (2, 1, 1)
    (failure,) = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert failure["stage"] == "label" and "no row for key 'bad\\udcff'" in failure["reason"]


def test_a_label_with_a_line_break_is_a_named_failure_not_a_class(tmp_path):
    """labels.txt holds one class a line: a label with a line break fails its images (named in
    failures.jsonl, the row counted invalid) instead of adding lines and shifting every id."""
    for name in ("a", "b", "c"):
        write_image(tmp_path / "imgs" / f"{name}.png", seed=ord(name))
    (tmp_path / "t.csv").write_text('id,label\na,"cat\ndog"\nb,zebra\nc,ant\n')
    out = tmp_path / "out"
    summary = _convert(
        ["--input", str(tmp_path / "imgs"), "--labels", str(tmp_path / "t.csv"), "--output_dir", str(out)]
    )
    assert (summary["written"], summary["failed"], summary["labels"]["invalid_rows"]) == (2, 1, 1)
    assert (out / "labels.txt").read_text().splitlines() == ["ant", "zebra"]
    (failure,) = [json.loads(x) for x in (out / "failures.jsonl").open()]
    assert failure["path"].endswith("a.png") and "contains a control character" in failure["reason"]
    assert sorted((r["filename"], r["label"]) for r in read_records(out)) == [("b.png", [1]), ("c.png", [0])]


def test_integer_labels_named_by_an_id_name_label_map(dacon, tmp_path):
    """GLDv2/Dacon: train.csv holds landmark ids, category.csv names them. The ids stay the
    labels; labels.txt, the records' text and the TFDS label names are the categories."""
    import tensorflow_datasets as tfds

    names = ["경복궁", "광화문", "남산타워", "Category:Haedong_Yonggungsa", "Category:Gwangalli", "해운대"]
    category = tmp_path / "category.csv"  # out of id order, one name quoted (it holds a comma)
    rows = [f"{i},{n}" for i, n in enumerate(names)]
    rows[1] = '1,"광화문, 서울"'
    category.write_text("landmark_id,landmark_name\n" + "\n".join(reversed(rows)) + "\n", encoding="utf-8")
    names[1] = "광화문, 서울"
    out = tmp_path / "out"
    argv = ["--input", str(dacon / "train"), "--labels", str(dacon / "train.csv")]
    summary = _convert(
        argv + ["--label_column", "landmark_id", "--label_map", str(category), "--output_dir", str(out)]
    )
    assert summary["written"] == 7 and summary["failed"] == 3  # as without the map (2 unlabeled, 1 conflict)
    assert (out / "labels.txt").read_text(encoding="utf-8").splitlines() == names
    for r in read_records(out):
        landmark = _LANDMARK_ID[r["filename"].rsplit("/", 1)[0]]
        assert r["label"] == [landmark] and r["text"] == [names[landmark]], r["filename"]
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["image"]["class"]["label"].names == names
    labels = [
        ex["image"]["class"]["label"].tolist() for ex in tfds.as_numpy(builder.as_dataset(split="train"))
    ]
    assert sorted(labels) == sorted(r["label"][0] for r in read_records(out))


def test_label_map_table_errors(tmp_path):
    from transforms.labels.label_map import load_label_map

    cases = {
        "gap.csv": ("id,name\n0,a\n2,b\n", "ids must run without gaps from 0: id 1 is missing"),
        "twice.csv": ("0,a\n0,b\n", "id 0 is listed twice"),
        "three.csv": ("id,name,x\n0,a,b\n", "line 1 has 3 columns"),
        "words.csv": ("a,b\nc,d\n", "no column holds an integer id"),
        "dup.tsv": ("1\ta\n2\ta\n", "lists 'a' twice"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            load_label_map(str(tmp_path / name))
    (tmp_path / "names.csv").write_text("name,id\nb,11\na,10\n")  # name,id order, from id 10
    label_map = load_label_map(str(tmp_path / "names.csv"))
    assert (label_map.names, label_map.first_id) == (("a", "b"), 10)
    assert [label_map.find(t) for t in ("a", "b", "10", "11", "010", "12", "c")] == [
        "a",
        "b",
        "a",
        "b",
        "a",
        None,
        None,
    ]


def test_exit_3_keeps_orphan_labels_and_names_it(tmp_path, capsys):
    """Too many failures (exit 3): nothing is published, but the rows that matched no image,
    often the cause (keys in another form), are kept next to failures.jsonl and named."""
    for name in ("a1", "a2", "a3", "a4"):
        write_image(tmp_path / "in" / "c" / f"{name}.png", seed=len(name))
    table = tmp_path / "labels.csv"
    table.write_text("id,label\na1,cat\nA2.PNG,cat\nA3.PNG,cat\nA4.PNG,dog\n")
    out = tmp_path / "out"
    argv = ["--input", str(tmp_path / "in"), "--output_dir", str(out), "--labels", str(table), "--quiet"]
    assert main.main(argv) == main.EXIT_TOO_MANY_FAILURES
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"the 3 table rows that matched no image in {out / 'orphan_labels.jsonl'}" in line
    orphans = [json.loads(x) for x in (out / "orphan_labels.jsonl").read_text().splitlines()]
    assert [o["key"] for o in orphans] == ["A2.PNG", "A3.PNG", "A4.PNG"]
    assert not (out / "summary.json").exists() and (out / "failures.jsonl").exists()
