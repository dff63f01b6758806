"""README.md stays true: its snippets run, its Python range matches setup.py and the Makefile.

Every ```sh and ```python block of README.md is extracted and run, in order, in a scratch folder
holding a small `flowers/` dataset and a `.venv` link to this interpreter's venv; a block
preceded by `<!-- not run: reason -->` is skipped (it installs from PyPI or runs the suite).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
VENV_BIN = Path(sys.executable).parent

_BLOCK = re.compile(r"(?P<skip><!-- not run: [^>]+-->\n)?```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


def readme_blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, run?) of every fenced block, in order."""
    return [(m["lang"], m["code"], not m["skip"]) for m in _BLOCK.finditer(text)]


def test_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    blocks = readme_blocks(text)
    # The two commands come first, as they are: they do all the set-up on a fresh machine.
    first = [line.split("#")[0].strip() for line in blocks[0][1].splitlines()]
    assert first == ["make demo", "make test"]
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (REPO / link).is_file(), link
    # The run blocks are the ones a user can try offline; the skipped ones say why.
    assert sum(run for _, _, run in blocks) >= 4
    assert all(lang in ("sh", "python", "text") for lang, _, _ in blocks)


def test_the_first_screen_fits_in_40_lines():
    """What a new user sees first, the title to the end of the quick start, on one screen."""
    lines = README.read_text().splitlines()
    first_screen = lines[: lines.index("## Install")]
    assert len(first_screen) <= 40, len(first_screen)


def _setup_kwargs() -> dict:
    tree = ast.parse((REPO / "setup.py").read_text())
    values = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    call = next(
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setup"
    )
    kwargs = {k.arg: k.value for k in call.keywords}
    return {
        "python_requires": ast.literal_eval(kwargs["python_requires"]),
        "pythons": ast.literal_eval(values["PYTHONS"]),
        "classifiers": ast.unparse(kwargs["classifiers"]),
        "extras": ast.unparse(kwargs["extras_require"]),
    }


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def test_the_python_range_is_the_same_in_readme_setup_and_makefile():
    text = README.read_text()
    setup = _setup_kwargs()
    low, high = re.search(r"runs on Python (3\.\d+) to (3\.\d+)", text).groups()
    assert setup["pythons"] == tuple(f"3.{m}" for m in range(_minor(low), _minor(high) + 1))
    assert setup["python_requires"] == f">={low},<3.{_minor(high) + 1}"
    assert "PYTHONS" in setup["classifiers"]
    # make test builds the Airflow venv, locked for the Makefile's --python-version.
    airflow = re.search(r"--python-version (3\.\d+)", (REPO / "Makefile").read_text())[1]
    assert re.search(rf"`make test`\s+needs {re.escape(airflow)} or newer", text)
    quick = re.search(r"with Python ([\d., or]+) and `make`", text)[1]
    assert re.findall(r"3\.\d+", quick) == [f"3.{m}" for m in range(_minor(airflow), _minor(high) + 1)]
    assert f"3.{sys.version_info.minor}" in setup["pythons"]  # this interpreter is one of them
    assert "'tfds'" in setup["extras"] and "pip install '.[tfds]'" in text


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder as after `make demo` next to a user's own `flowers/`: .venv and 2 classes."""
    root = tmp_path_factory.mktemp("readme")
    (root / ".venv").symlink_to(VENV_BIN.parent)
    for cls, colour in (("daisy", (250, 250, 250)), ("tulip", (200, 20, 60))):
        for i in range(5):
            path = root / "flowers" / cls / f"{cls}{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16 + i, 12), colour).save(path, quality=90)
    return root


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"  # the img2tfrecord command only after `source .venv/bin/activate`
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def test_every_runnable_readme_snippet_runs(scratch):
    blocks = [(lang, code) for lang, code, run in readme_blocks(README.read_text()) if run]
    assert [lang for lang, _ in blocks].count("python") >= 2
    activate = "source .venv/bin/activate\n"
    for i, (lang, code) in enumerate(blocks):
        if lang == "text":
            continue
        if lang == "sh":
            # Each block runs as a user types it; the first one activates the venv, later ones
            # run in that same shell state (as a user would after following the README).
            prefix = "" if activate in code else activate
            command = ["bash", "-e", "-o", "pipefail", "-c", prefix + code]
        else:
            command = [str(scratch / ".venv" / "bin" / "python"), "-c", code]
        result = subprocess.run(command, cwd=scratch, env=_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"block {i} ({lang}):\n{code}\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
    # What the blocks claim happened, happened.
    out = scratch / "out"
    assert sorted(p.name for p in out.glob("*-of-*.tfrecord"))
    for name in ("labels.txt", "summary.json", "failures.jsonl", "dataset_info.json", "features.json"):
        assert (out / name).is_file(), name
    assert (scratch / "report.html").is_file()
    assert (scratch / "out2" / "summary.json").is_file()


def test_the_output_block_names_files_a_conversion_writes(scratch):
    text = README.read_text()
    block = next(code for lang, code, _ in readme_blocks(text) if lang == "text" and "out/" in code)
    named = set(re.findall(r"out/([\w.-]+)", block))
    out = scratch / "out"
    if not out.exists():
        pytest.skip("needs the snippets' output (test_every_runnable_readme_snippet_runs)")
    written = {p.name for p in out.iterdir()}
    for name in named - {"train-00000-of-00003.tfrecord"}:
        assert name in written, name


READING = REPO / "docs" / "reading.md"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """`out` (class folders: one label a record, train and validation) and `out_multi` (a
    table with two labels for some images), as docs/reading.md's blocks read them."""
    from beam_pipeline import main

    root = tmp_path_factory.mktemp("reading")
    rows = ["id,label"]
    for cls, colour in (("daisy", (250, 250, 250)), ("tulip", (200, 20, 60))):
        for i in range(6):
            path = root / "flowers" / cls / f"{cls}{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16 + i, 12), colour).save(path, quality=90)
            rows.append(
                f"{cls}{i},{cls}|{'white' if cls == 'daisy' else 'red'}" if i % 2 else f"{cls}{i},{cls}"
            )
    (root / "tags.csv").write_text("\n".join(rows) + "\n")
    common = ["--input", str(root / "flowers"), "--quiet"]
    main.run([*common, "--output_dir", str(root / "out"), "--splits", "train=0.5,validation=0.5"], False)
    main.run([*common, "--output_dir", str(root / "out_multi"), "--labels", str(root / "tags.csv")], False)
    return root


def test_the_tf_data_loops_of_reading_md_run_with_a_scalar_label_or_a_sparse_one(datasets):
    blocks = [code for lang, code, run in readme_blocks(READING.read_text()) if run and lang == "python"]
    loops = [code for code in blocks if "tf.data.TFRecordDataset" in code]
    # The spec, then a three-line loop: for, parse, print.
    assert len(loops) == 2 and all(
        len(code.split("spec = parse_spec(")[1].splitlines()) == 4 for code in loops
    )
    printed = []
    for code in blocks:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=datasets,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{code}\n{result.stderr}"
        printed.append(result.stdout.splitlines())
    single, multi = (printed[blocks.index(code)] for code in loops)
    # One label a record: a scalar id and its name, `int()` as the loop calls it.
    assert len(single) == 2 and all(re.fullmatch(r"[01] (daisy|tulip)", line) for line in single), single
    # Several labels: every id of the image (a SparseTensor's values), and their names.
    assert len(multi) == 2 and all(line.startswith("[") for line in multi), multi
    summary = json.loads((datasets / "out_multi" / "summary.json").read_text())
    assert summary["labels_per_record"] == {"min": 1, "max": 2}
    ids = [ast.literal_eval(line.split("] ")[0] + "]") for line in multi]
    names = (datasets / "out_multi" / "labels.txt").read_text().splitlines()
    for line, got in zip(multi, ids):
        assert [names[i] for i in got] == [t.decode() for t in ast.literal_eval("[" + line.split("] [")[1])]


def test_the_readme_names_every_key_a_slim_record_has():
    from transforms.encoding.schema import SLIM

    text = README.read_text()
    paragraph = text[text.index("Each record carries the TF-slim keys") :].split("\n\n")[0]
    assert [key for key in SLIM.kinds if f"`{key}`" not in paragraph] == []


def test_the_label_docs_commands_write_different_folders():
    """Run one after the other, the second must not stop on the first one's dataset."""
    outputs = re.findall(r"--output_dir (\S+)", (REPO / "docs" / "labels.md").read_text())
    assert len(outputs) >= 2 and len(set(outputs)) == len(outputs), outputs


def _make_dry_run(target: str) -> list[str]:
    """The commands `make TARGET` would run from scratch (`make -n -B`: printed, none run)."""
    result = subprocess.run(
        ["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_demo_installs_the_package_alone():
    installs = [line for line in _make_dry_run("demo") if " pip install " in line and "uv" in line]
    assert installs and all(line.split()[-1] == "." for line in installs), installs
    assert "test]" not in " ".join(_make_dry_run("demo"))


def test_the_airflow_venv_install_says_what_it_does_and_how_long_it_took():
    commands = "\n".join(_make_dry_run("airflow-venv"))
    assert 'echo "installing Airflow for its tests:' in commands
    assert "installed in $(( $(date +%s) - start )) s" in commands
