"""--label_map files: lines split at "\\n" only, bad names refused by line, padding linear in the first id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from transforms.labels.label_map import load_label_map

REPO = Path(__file__).resolve().parents[2]

# Characters str.splitlines breaks at (and a TFDS names_file does not): inside a name they
# shifted every later id by one.
NOT_LINE_BREAKS_FOR_TFDS = ["\x85", "\u2028", "\x1c"]


@pytest.mark.parametrize("char", NOT_LINE_BREAKS_FOR_TFDS)
@pytest.mark.parametrize(
    "name, text, line",
    [
        ("names.txt", "cat\r\nd{}og\r\nemu\n", 2),  # a names file
        ("map.csv", "id,name\r\n7,cat\r\n8,d{}og\r\n9,emu\r\n", 3),  # an id,name table
    ],
)
def test_lines_split_at_newline_only_and_a_name_with_a_line_break_is_refused_by_line(
    tmp_path, char, name, text, line
):
    path = tmp_path / name
    path.write_text(text.format(char), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{name} line {line}: class name .* contains a control character"):
        load_label_map(str(path))


def test_quoted_name_over_two_lines_is_refused_by_its_first_line(tmp_path):
    path = tmp_path / "map.csv"
    path.write_text('0,cat\n1,"d\nog"\n2,emu\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"map\.csv line 2: class name 'd\\nog' contains a control"):
        load_label_map(str(path))


def test_crlf_blank_lines_and_spaces_are_not_names(tmp_path):
    (tmp_path / "names.txt").write_text("cat \r\n\r\n  dog\r\n\n", encoding="utf-8")
    label_map = load_label_map(str(tmp_path / "names.txt"), 3)
    assert (label_map.names, label_map.first_id) == (("cat", "dog"), 3)
    (tmp_path / "map.tsv").write_text("id\tname\r\n5\tcat\r\n\r\n6\tdog\r\n", encoding="utf-8")
    label_map = load_label_map(str(tmp_path / "map.tsv"))
    assert (label_map.names, label_map.first_id) == (("cat", "dog"), 5)


def _table_args(tmp_path: Path, label_map: Path) -> list[str]:
    for i in range(3):
        write_image(tmp_path / "in" / f"{i}.png", (4, 4), seed=i)
    (tmp_path / "t.csv").write_text("id,label\n0,cat\n1,dog\n2,emu\n")
    return [
        "--input",
        str(tmp_path / "in"),
        "--labels",
        str(tmp_path / "t.csv"),
        "--key_column",
        "id",
        "--label_map",
        str(label_map),
        "--output_dir",
        str(tmp_path / "out"),
        "--quiet",
    ]


def test_cli_names_the_line_in_one_line_exit_2(tmp_path, capsys):
    label_map = tmp_path / "names.txt"
    label_map.write_text("cat\ndog\u2028x\nemu\n", encoding="utf-8")
    assert main.main(["convert", *_table_args(tmp_path, label_map)]) == main.EXIT_USAGE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("img2tfrecord: error: --label_map ") and "names.txt line 2: class name" in line
    assert not (tmp_path / "out").exists()


def test_map_whose_ids_start_at_300000_pads_the_tfds_names_in_linear_time(tmp_path):
    """The TFDS names below the first id are placeholders, unique and none a class name.

    Before, each placeholder was looked up in lists of the names and the placeholders made so
    far: ~5 minutes at 300,000 (quadratic); now a fraction of a second. The timeout is a hang
    guard for the whole command, tens of times what it needs.
    """
    first = 300_000
    label_map = tmp_path / "map.csv"
    label_map.write_text(f"{first},cat\n{first + 1},dog\n{first + 2},background_1\n{first + 3},emu\n")
    done = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *_table_args(tmp_path, label_map)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    (names_file,) = (tmp_path / "out").glob("*.labels.txt")
    names = names_file.read_text().splitlines()
    assert len(names) == first + 4 and names[first:] == ["cat", "dog", "background_1", "emu"]
    assert names[:3] == ["background", "background_2", "background_3"]
    assert names[first - 1] == f"background_{first}" and len(set(names)) == len(names)


def test_graph_with_gldv2_sized_map_stays_under_2_mb(tmp_path):
    """203,094 classes named by ~70-character URLs (GLDv2's train_label_to_category.csv) and a
    labels table: the names reach the workers as a side input read from the file, so the
    serialized job graph is about its size with ten classes (9.5 MB to 29 MB before, the map
    pickled into BuildClassIndex, JoinLabels and WriteOrphans; Dataflow refuses 10 MB)."""
    import random
    import string

    import apache_beam as beam

    from beam_pipeline.cli.options import ConvertOptions, route_labels_flag
    from beam_pipeline.pipeline import build_pipeline

    rnd = random.Random(0)
    letters = string.ascii_letters + "_()0123456789"
    label_map = tmp_path / "train_label_to_category.csv"
    with label_map.open("w") as f:
        f.write("landmark_id,category\n")
        for i in range(203_094):
            name = "".join(rnd.choice(letters) for _ in range(27))
            f.write(f"{i},http://commons.wikimedia.org/wiki/Category:{name}\n")
    args = _table_args(tmp_path, label_map) + ["--label_column", "label"]
    options = main.RunOptions(route_labels_flag(args))
    p = beam.Pipeline(options=options)
    build_pipeline(p, options.view_as(ConvertOptions), "0" * 32)
    size = len(p.to_runner_api().SerializeToString())
    assert size < 2_000_000, size


def test_summary_holds_counts_not_names_and_many_classes_go_to_class_counts_csv(tmp_path, monkeypatch):
    """summary.json carries counts, never a copy of the class names (labels.txt has them); past
    SUMMARY_CLASSES (split, class) pairs the per-class counts are in class_counts.csv, and the
    readers (verify, inspect, load_dataset) and the TFDS names file still agree with labels.txt."""
    import csv
    import json

    import transforms.output.summary as summary_module
    from beam_pipeline.readers.dataset import load_dataset
    from beam_pipeline.readers.inspect import collect_stats
    from beam_pipeline.readers.verify import verify

    monkeypatch.setattr(summary_module, "SUMMARY_CLASSES", 2)
    images = tmp_path / "imgs"
    for i, cls in enumerate(("cat", "cat", "dog", "emu")):
        write_image(images / cls / f"{i}.png", (6 + i, 5), seed=i)
    out = tmp_path / "out"
    summary = main.run(["--input", str(images), "--output_dir", str(out), "--quiet"], save_main_session=False)
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary and "class_names" not in summary and "written_per_class" not in summary
    assert summary["num_classes"] == 3 and summary["labels_per_record"] == {"min": 1, "max": 1}
    assert summary["class_counts_file"] == "class_counts.csv" and "classes" not in summary["splits"]["train"]
    rows = list(csv.reader((out / "class_counts.csv").open()))
    assert rows == [
        ["split", "class", "listed", "written", "failed"],
        ["train", "cat", "2", "2", "0"],
        ["train", "dog", "1", "1", "0"],
        ["train", "emu", "1", "1", "0"],
    ]
    assert (out / "labels.txt").read_text() == "cat\ndog\nemu\n"
    assert (out / "image-class-label.labels.txt").read_bytes() == (out / "labels.txt").read_bytes()
    checks, problems = verify(str(out))
    assert problems == [] and sum(c.records for c in checks) == 4
    stats = collect_stats(str(out))
    assert {cls: s.records for cls, s in stats.splits["train"].items()} == {"cat": 2, "dog": 1, "emu": 1}
    assert sorted(int(label) for _, label in load_dataset(str(out))) == [0, 0, 1, 2]
    monkeypatch.setattr(summary_module, "SUMMARY_CLASSES", 1000)  # a rerun with few classes: no stale file
    main.run(
        ["--input", str(images), "--output_dir", str(out), "--quiet", "--overwrite"], save_main_session=False
    )
    assert not (out / "class_counts.csv").exists()
    assert json.loads((out / "summary.json").read_text())["written_per_class"] == {
        "cat": 2,
        "dog": 1,
        "emu": 1,
    }
