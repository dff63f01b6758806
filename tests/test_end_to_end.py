"""convert on real images, read back with TensorFlow; CLI errors are one line, no traceback."""

import json
import os
import subprocess
import sys

import pytest

from beam_pipeline import main
from tests.conftest import METADATA_FILES, read_records, write_image


def _convert(args):
    return main.run(args + ["--quiet"], save_main_session=False)


def test_convert_reads_back_with_tensorflow(image_tree, tmp_path):
    write_image(image_tree / "cat" / "png_named.jpg", (9, 11), "RGB", fmt="PNG")
    (image_tree / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (image_tree / "dog house" / "empty.png").write_bytes(b"")
    (image_tree / "서울광장" / "html.jpg").write_text("<html>404</html>")
    out = tmp_path / "out"
    summary = _convert(["--input", str(image_tree), "--output_dir", str(out), "--max_failure_ratio", "0.5"])

    assert summary["listed"] == 10 and summary["written"] == 7 and summary["failed"] == 3
    assert summary["listed"] == summary["written"] + summary["failed"]
    assert summary["written_per_class"] == {"cat": 3, "dog house": 2, "서울광장": 2}
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "labels.txt").read_text(encoding="utf-8").splitlines() == ["cat", "dog house", "서울광장"]
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert sorted(os.path.basename(f["path"]) for f in failures) == ["broken.jpg", "empty.png", "html.jpg"]
    assert all(f["reason"] for f in failures)
    assert sorted(os.listdir(out)) == sorted(METADATA_FILES + ["train-00000-of-00001.tfrecord"])

    records = read_records(out)
    by_name = {r["filename"]: r for r in records}
    assert set(by_name) == {
        "cat/a.jpg",
        "cat/deep/er/b.JPEG",
        "cat/png_named.jpg",
        "dog house/c.png",
        "dog house/d.PNG",
        "서울광장/e.gif",
        "서울광장/f.bmp",
    }
    classes = ["cat", "dog house", "서울광장"]
    for name, r in by_name.items():
        assert r["decoded_shape"] == (r["height"], r["width"], r["channels"])
        assert r["text"] == [name.split("/")[0]]
        assert r["label"] == [classes.index(name.split("/")[0])]
        assert r["encoded"] == (image_tree / name).read_bytes()  # original bytes kept
    assert by_name["cat/a.jpg"]["decoded_shape"] == (20, 32, 3)
    assert by_name["cat/png_named.jpg"]["format"] == "png"
    assert by_name["dog house/c.png"]["channels"] == 4
    assert by_name["dog house/d.PNG"]["channels"] == 1


def test_max_records_per_shard_cuts_shards_of_small_images(image_tree, tmp_path):
    out = tmp_path / "out"
    summary = _convert(["--input", str(image_tree), "--output_dir", str(out), "--max_records_per_shard", "2"])
    shards = sorted(p.name for p in out.glob("train-*.tfrecord"))
    assert shards == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert summary["written"] == 6 and len(read_records(out)) == 6
    import tensorflow as tf

    assert [sum(1 for _ in tf.data.TFRecordDataset(str(out / name))) for name in shards] == [2, 2, 2]


def test_label_offset_and_splits_and_rerun_refused(image_tree, tmp_path):
    out = tmp_path / "out"
    summary = _convert(
        [
            "--input",
            str(image_tree),
            "--output_dir",
            str(out),
            "--label_offset",
            "1",
            "--splits",
            "train=0.5,test=0.5",
            "--seed",
            "3",
        ]
    )
    splits = {s for s, v in summary["splits"].items() if v["written"]}
    written = sum(len(read_records(out, s)) for s in splits)
    assert written == summary["written"] == 6
    labels = {lab for s in splits for r in read_records(out, s) for lab in r["label"]}
    assert labels <= {1, 2, 3} and 1 in labels
    with pytest.raises(main.UserError, match="already holds a dataset"):
        _convert(["--input", str(image_tree), "--output_dir", str(out)])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--input", "{tmp}/nope", "--output_dir", "{tmp}/o"], "no such folder"),
        (["--input", "{tmp}/empty", "--output_dir", "{tmp}/o"], "no image files"),
        (["--input", "{tmp}/empty", "--output_dir", "{tmp}/o", "--ouput_dir", "x"], "unrecognized arguments"),
        (["--input", "{tmp}/empty", "--output_dir", "{tmp}/o", "--splits", "train=2"], "sum to"),
        (["--input", "{tmp}/empty", "--output_dir", "{tmp}/o", "--shard_size_mb", "abc"], "invalid float"),
        (
            ["--input", "{tmp}/imgs", "--output_dir", "{tmp}/o", "--max_records_per_shard", "-1"],
            "0 (no limit)",
        ),
        (["--input", "{tmp}/empty"], "--output_dir is required"),
        (["--input", "{tmp}/imgs", "--output_dir", "/proc/img2tfrecord-out"], "not writable"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no images here")
    write_image(tmp_path / "imgs" / "c" / "x.png")
    argv = ["convert"] + [a.format(tmp=tmp_path) for a in args] + ["--quiet"]
    assert main.main(argv) == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("img2tfrecord: error:")
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("command", [["img2tfrecord"], [sys.executable, "-m", "beam_pipeline"]])
def test_cli_entry_points(image_tree, tmp_path, command):
    if command[0] == "img2tfrecord":
        command = [os.path.join(os.path.dirname(sys.executable), "img2tfrecord"), "convert"]
    out = tmp_path / "out"
    done = subprocess.run(
        command + ["--input", str(image_tree), "--output_dir", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 6 of 6 images" in done.stderr
    assert len(read_records(out)) == 6
    bad = subprocess.run(
        command + ["--input", str(tmp_path / "missing"), "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_accounting_error_names_the_first_mismatch():
    from transforms.output.summary import accounting_error

    good = {
        "listed": 3,
        "written": 2,
        "failed": 1,
        "splits": {
            "train": {
                "listed": 3,
                "written": 2,
                "failed": 1,
                "classes": {
                    "a": {"listed": 2, "written": 1, "failed": 1},
                    "b": {"listed": 1, "written": 1, "failed": 0},
                },
            }
        },
    }
    assert accounting_error(good) is None
    lost = json.loads(json.dumps(good))
    lost["splits"]["train"]["classes"]["b"]["written"] = 0
    assert accounting_error(lost) == "class 'b' of split 'train': listed 1 != written 0 + failed 0"
    lost["written"] = 1
    assert accounting_error(lost).startswith("dataset: listed 3 != written 1 + failed 1")
