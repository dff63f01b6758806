"""A new user's slips get a line that says what happened and what was meant (issue 33):
splits that end up empty or look misspelt, typos of flags, commands and --splits values,
what --unlabeled skip left out, and a dataset path that does not exist. Through the CLI
(`main.main`), reading stderr as a user does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image


def _images(root: Path, n: int = 3) -> Path:
    for i in range(n):
        write_image(root / ("cat" if i % 2 else "dog") / f"{i}.png", seed=i)
    return root


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    status = main.main(argv)
    return status, capsys.readouterr().err.splitlines()


# --- splits ------------------------------------------------------------------------------


def test_a_requested_split_that_ends_up_empty_is_a_warning_and_a_count(tmp_path, capsys):
    data, out = _images(tmp_path / "in"), tmp_path / "out"
    splits = "train=0.998,validation=0.001,test=0.001"  # 3 images: none hashes into the small two
    status, err = _cli(
        ["--input", str(data), "--output_dir", str(out), "--splits", splits, "--quiet"], capsys
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["splits"]) == ["train"] and summary["empty_splits"] == ["validation", "test"]
    assert err[-3:] == [
        "img2tfrecord: warning: split 'validation' is empty: none of the 3 images hashed into it "
        "(too few images for its ratio in --splits)",
        "img2tfrecord: warning: split 'test' is empty: none of the 3 images hashed into it "
        "(too few images for its ratio in --splits)",
        "img2tfrecord: wrote 3 of 3 images (none failed)",
    ]


def test_a_split_name_close_to_a_usual_one_is_a_warning_with_the_name_meant(tmp_path, capsys):
    data, out = _images(tmp_path / "in", 8), tmp_path / "out"
    argv = ["--input", str(data), "--output_dir", str(out), "--splits", "train=0.5,valdiation=0.5", "--quiet"]
    status, err = _cli(argv, capsys)
    assert status == 0, err
    assert (
        "img2tfrecord: warning: split 'valdiation' is not one of train, validation, test: "
        "did you mean 'validation'?"
    ) in err
    # Names far from the usual ones are a choice, not a typo: no warning.
    status, err = _cli([*argv[:4], "--splits", "train=0.5,val=0.5", "--overwrite", "--quiet"], capsys)
    assert status == 0 and not [line for line in err if "warning" in line], err


def test_split_folders_with_a_misspelt_name_get_the_same_warning(tmp_path, capsys):
    data, out = tmp_path / "in", tmp_path / "out"
    for split in ("train", "tset"):
        for cls in ("cat", "dog"):
            write_image(data / split / cls / "a.png")
    status, err = _cli(
        ["--input", str(data), "--output_dir", str(out), "--splits", "folders", "--quiet"], capsys
    )
    assert status == 0, err
    assert (
        err[-2]
        == "img2tfrecord: warning: split 'tset' is not one of train, validation, test: did you mean 'test'?"
    )


# --- typos: one line with the likely fix --------------------------------------------------


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["--input", "{in}", "--output-dir", "{out}"],
            "unrecognized arguments: --output-dir (did you mean --output_dir?)",
        ),
        (
            ["--input", "{in}", "--output_dir", "{out}", "--qiet"],
            "unrecognized arguments: --qiet (did you mean --quiet?)",
        ),
        (
            ["--input", "{in}", "--output_dir", "{out}", "--max-failure-ratio=0.1"],
            "unrecognized arguments: --max-failure-ratio=0.1 (did you mean --max_failure_ratio?)",
        ),
        (
            ["conver", "--input", "{in}"],
            "unknown command 'conver': did you mean convert? (one of convert, demo, verify, inspect)",
        ),
        (
            ["inspcet", "{out}"],
            "unknown command 'inspcet': did you mean inspect? (one of convert, demo, verify, inspect)",
        ),
        (
            ["--input", "{in}", "--output_dir", "{out}", "--splits", "folder"],
            "--splits: expected name=ratio,... or folders, got 'folder': did you mean --splits folders?",
        ),
        (
            ["--input", "{in}", "--output_dir", "{out}", "--splits", "train=80,validation=20"],
            "--splits: ratios sum to 100, not 1: did you mean --splits train=0.8,validation=0.2?",
        ),
        (
            ["verify", "{out}", "--runer", "DirectRunner"],
            "unrecognized arguments: --runer (did you mean --runner?)",
        ),
    ],
)
def test_typos_get_did_you_mean_in_one_line(tmp_path, capsys, argv, line):
    data = _images(tmp_path / "in")
    argv = [a.format(**{"in": str(data), "out": str(tmp_path / "out")}) for a in argv]
    status, err = _cli(argv, capsys)
    assert status == 2
    assert err[-1] == f"img2tfrecord: error: {line}"
    assert not (tmp_path / "out").exists()


# --- what was skipped, what does not exist -----------------------------------------------


def test_the_final_line_counts_images_skipped_as_unlabeled(tmp_path, capsys):
    data, out = _images(tmp_path / "in", 5), tmp_path / "out"
    (tmp_path / "labels.csv").write_text("id,label\n0,dog\n1,cat\n2,dog\n")  # 3 and 4 have no row
    argv = ["--input", str(data), "--output_dir", str(out), "--labels", str(tmp_path / "labels.csv")]
    status, err = _cli([*argv, "--unlabeled", "skip", "--quiet"], capsys)
    assert status == 0, err
    assert (
        err[-1]
        == "img2tfrecord: wrote 3 of 3 images (none failed); skipped 2 unlabeled images (--unlabeled skip)"
    )


@pytest.mark.parametrize("verb", ["verify", "inspect"])
def test_reading_a_path_that_does_not_exist_says_no_such_folder(tmp_path, capsys, verb):
    status, err = _cli([verb, str(tmp_path / "nosuch")], capsys)
    assert status == 2 and err == [f"img2tfrecord: error: {tmp_path / 'nosuch'}: no such folder"]
    (tmp_path / "empty").mkdir()
    status, err = _cli([verb, str(tmp_path / "empty")], capsys)
    assert status == 2 and "no summary.json (not a finished img2tfrecord dataset)" in err[-1]


def test_verify_help_says_beam_runner_flags_are_accepted(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's help, as for every verb
        main.main(["verify", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Any Apache Beam pipeline option is accepted too (--runner, --project, --region" in text
