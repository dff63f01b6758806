"""Every step safe to run twice: `--direct_runner_bundle_repeat 1` executes each bundle twice
(the first execution's outputs discarded, its side effects kept), as a runner re-runs a bundle
after a worker loss. The run must exit 0 with output byte-identical to a single execution."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repeat")
    images = root / "images"
    for i in range(9):
        write_image(images / ("cat", "dog", "eel")[i % 3] / f"{i:02d}.png", (10 + i, 12), seed=i)
    (images / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    rows = ["id,label"] + [f"{i:02d},{('cat', 'dog', 'eel')[i % 3]}" for i in range(8)] + ["zz,orphan"]
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    with tarfile.open(root / "images.tar", "w") as t:
        t.add(images, arcname=".")
    return root


CASES = {
    "folder": lambda r: ["--input", str(r / "images")],
    "table": lambda r: ["--input", str(r / "images"), "--labels", str(r / "labels.csv")],
    "tar": lambda r: ["--input", str(r / "images.tar")],
    "stratify": lambda r: [
        "--input",
        str(r / "images"),
        "--splits",
        "train=0.5,validation=0.5",
        "--stratify",
    ],
}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bundle_run_twice_gives_the_single_runs_output(inputs, tmp_path, case):
    args = [*CASES[case](inputs), "--quiet", "--max_failure_ratio", "1"]
    once, twice = tmp_path / "once", tmp_path / "twice"
    assert main.main([*args, "--output_dir", str(once)]) == main.EXIT_OK
    assert (
        main.main([*args, "--output_dir", str(twice), "--direct_runner_bundle_repeat", "1"]) == main.EXIT_OK
    )
    expected = _files(once)
    assert any(name.endswith(".tfrecord") for name in expected)
    assert _files(twice) == expected
