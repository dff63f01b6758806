"""What a new user reads first: the demo's command, the final line of a conversion."""

from __future__ import annotations

import json
import shlex

from beam_pipeline import main
from beam_pipeline.cli.options import DEFAULT_MAX_FAILURE_RATIO
from beam_pipeline.cli.outcome import final_line
from tests.conftest import write_image


def test_the_demo_prints_the_command_it_runs_with_its_failure_ratio(tmp_path, capsys):
    data, out = tmp_path / "demo_data", tmp_path / "demo_out"
    assert main.main(["demo", "--data_dir", str(data), "--output_dir", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("running: ")
    command = shlex.split(lines[0].removeprefix("running: "))  # (under pytest: python -m beam_pipeline)
    flags = command[command.index("convert") + 1 :]
    assert flags[flags.index("--input") + 1] == str(data) and flags[flags.index("--output_dir") + 1] == str(
        out
    )
    assert "--overwrite" in flags and flags[flags.index("--splits") + 1] == "train=0.8,validation=0.2"
    ratio = flags[flags.index("--max_failure_ratio") + 1]
    assert float(ratio) > DEFAULT_MAX_FAILURE_RATIO and flags[-1] == "--quiet"  # extra flags too
    # Why the ratio, and what the default means for the user's own first run.
    assert (
        f"--max_failure_ratio {ratio}" in lines[1] and f"the default, {DEFAULT_MAX_FAILURE_RATIO}" in lines[1]
    )
    assert "exit 3" in lines[1]
    summary = json.loads("\n".join(lines[2:-1]))
    assert summary["failed"] == 2 and summary["written"] == summary["listed"] - 2
    # The command as printed is the command that ran: rerun, it writes the same dataset.
    shards = {p.name: p.read_bytes() for p in out.glob("*.tfrecord")}
    assert main.main(flags) == 0
    assert {p.name: p.read_bytes() for p in out.glob("*.tfrecord")} == shards


def test_the_final_line_counts_like_the_bar_and_names_failures_jsonl_only_when_something_failed(
    tmp_path, capsys
):
    for i in range(3):
        write_image(tmp_path / "in" / "cat" / f"{i}.png", seed=i)
    argv = ["--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), "--quiet"]
    assert main.main(argv) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "img2tfrecord: wrote 3 of 3 images (none failed)"
    summary = {"written": 1205, "listed": 1207, "failed": 2}
    assert final_line(summary) == ("img2tfrecord: wrote 1,205 of 1,207 images (2 failed, see failures.jsonl)")
