"""Literal paths first: a path the user gives that exists is that file, whatever its name holds.

`--input /x/set[1].tar` names the archive `set[1].tar` when it exists (it was a glob: alone
"no such archive", beside `set1.tar` it converted set1.tar, exit 0); only a path that does not
exist is a glob. The same for the labels table. Through the CLI (main.main), on real tars.
"""

from __future__ import annotations

import glob
import tarfile
from pathlib import Path

from beam_pipeline import main
from tests.conftest import write_image


def _archive(path: Path, classes: dict[str, int], seed: int) -> Path:
    """A tar of class folders, `classes` naming how many images each holds."""
    folder = path.parent / (path.name + ".d")
    for c, (name, count) in enumerate(classes.items()):
        for i in range(count):
            write_image(folder / name / f"{i}.png", (10 + i, 8), seed=seed + 10 * c + i)
    with tarfile.open(path, "w") as t:
        for name in classes:
            t.add(folder / name, arcname=name)
    return path


def _filenames(out: Path) -> list[str]:
    import tensorflow as tf

    names = []
    for shard in sorted(glob.glob(str(out / "*-of-*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(shard):
            example = tf.train.Example.FromString(raw.numpy())
            names.append(example.features.feature["image/filename"].bytes_list.value[0].decode())
    return sorted(names)


def _convert(args: list[str], capsys) -> tuple[int, str]:
    status = main.main([*args, "--quiet"])
    return status, capsys.readouterr().err.strip()


def test_an_existing_archive_with_brackets_in_its_name_is_taken_literally(tmp_path, capsys):
    literal = _archive(tmp_path / "in" / "set[1].tar", {"cat": 2, "dog": 1}, seed=0)
    # An archive the name matches as a glob, beside it: still the literal one.
    _archive(tmp_path / "in" / "set1.tar", {"bird": 4}, seed=50)
    status, err = _convert(["--input", str(literal), "--output_dir", str(tmp_path / "beside")], capsys)
    assert status == 0, err
    assert _filenames(tmp_path / "beside") == [
        "set[1].tar#cat/0.png",
        "set[1].tar#cat/1.png",
        "set[1].tar#dog/0.png",
    ]

    # A path that does not exist is a glob: `?` matches set1.tar (not set[1].tar).
    pattern = str(tmp_path / "in" / "set?.tar")
    status, err = _convert(["--input", pattern, "--output_dir", str(tmp_path / "glob")], capsys)
    assert status == 0, err
    assert [n.split("#")[0] for n in _filenames(tmp_path / "glob")] == ["set1.tar"] * 4


def test_an_existing_labels_table_with_a_star_in_its_name_is_taken_literally(tmp_path, capsys):
    for name in ("a", "b"):
        write_image(tmp_path / "imgs" / f"{name}.png", (9, 9), seed=ord(name))
    (tmp_path / "labels*.csv").write_text("file,label\na.png,cat\nb.png,dog\n")
    (tmp_path / "labels-old.csv").write_text("file,label\na.png,fish\nb.png,fish\n")  # matches the glob too
    args = ["--input", str(tmp_path / "imgs"), "--labels", str(tmp_path / "labels*.csv")]
    args += ["--key_column", "file", "--label_column", "label", "--image_key", "relpath"]
    status, err = _convert([*args, "--output_dir", str(tmp_path / "out")], capsys)
    assert status == 0, err
    assert (tmp_path / "out" / "labels.txt").read_text().split() == ["cat", "dog"]
