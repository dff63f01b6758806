"""`inspect` as a person reads it: quiet, aligned for wide class names, failures counted and listed,
captioned thumbnails, format and size distributions, class bars per split."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline import main
from beam_pipeline.readers import inspect as inspection
from tests.conftest import chromium_screenshot

SCRIPT = Path(sys.executable).parent / "img2tfrecord"
WIDE = "서울 광장"  # Hangul: two terminal columns per syllable


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A small dataset with wide and narrow class names, two formats and 12 failed files."""
    root = tmp_path_factory.mktemp("insp")
    images = root / "images"
    for cls, n in (("cat", 4), (WIDE, 3)):
        for i in range(n):
            path = images / cls / f"{cls[:1]}{i}.{'png' if i % 2 else 'jpg'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (20 + 40 * i, 30), (30 * i, 100, 200)).save(path)
    for i in range(12):
        (images / "cat" / f"empty{i:02d}.jpg").write_bytes(b"")
    (images / "cat" / "junk.png").write_bytes(b"<html>not an image</html>")
    out = root / "out"
    argv = ["--input", str(images), "--output_dir", str(out), "--quiet", "--max_failure_ratio", "1"]
    argv += ["--splits", "train=0.5,test=0.5", "--seed", "3"]
    main.run(argv, save_main_session=False)
    return out


def test_inspect_aligns_wide_class_names_and_counts_failures(converted, capsys):
    assert main.main(["inspect", str(converted)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    assert any(WIDE in r for r in rows) and any("cat" in r for r in rows)
    # The count column starts at the same terminal column on every row.
    starts = {inspection.display_width(re.match(r"^(  \S.*?\s{2,})\d", r)[1]) for r in rows}
    assert len(starts) == 1, rows
    assert "formats: jpeg: 4, png: 3" in out
    assert re.search(r"^widths \(px\): 17-20: 2, 57-64: 2, 97-112: 2, 129-160: 1$", out, re.M)
    assert re.search(
        r"^failed: 13 images not written \(failures\.jsonl\): 12 × empty file; 1 × not an image$", out, re.M
    )


def test_display_width_counts_wide_characters_twice():
    assert inspection.display_width("cat") == 3
    assert inspection.display_width(WIDE) == 9  # four syllables and a space
    assert inspection.display_width("e\u0301") == 1  # a combining accent takes no column
    assert inspection.pad(WIDE, 12) == WIDE + "   "


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.h2: list[str] = []
        self.captions: list[str] = []
        self.svg_labels: list[str] = []
        self.cells: list[str] = []
        self._tag = ""

    def handle_starttag(self, tag, attrs):
        self._tag = tag
        if tag == "svg":
            self.svg_labels.append(dict(attrs)["aria-label"])

    def handle_data(self, data):
        if self._tag == "h2":
            self.h2.append(data)
        elif self._tag == "figcaption":
            self.captions.append(data)
        elif self._tag in ("td", "th"):
            self.cells.append(data)
        self._tag = ""


def test_report_lists_failures_by_reason_and_captions_samples(converted, tmp_path, capsys):
    report = tmp_path / "report.html"
    argv = ["inspect", str(converted), "--report", str(report), "--samples", "2", "--failures", "3"]
    assert main.main(argv) == 0
    capsys.readouterr()
    page = _Page()
    page.feed(report.read_text(encoding="utf-8"))
    assert page.h2 == ["Splits", "Classes per split", "Images", "Failures", "Samples"]
    # Failures: per reason, commonest first, the first 3 of each and how many more.
    assert "empty file (12)" in page.cells and "not an image (1)" in page.cells
    assert page.cells.index("empty file (12)") < page.cells.index("not an image (1)")
    listed = [c for c in page.cells if re.search(r"cat/empty\d\d\.jpg$", c)]
    assert len(listed) == 3 and "... and 9 more" in page.cells
    # Class bars for each split, then the format and size distributions.
    assert page.svg_labels == [
        "classes of test",
        "classes of train",
        "format distribution",
        "width (px) distribution",
        "height (px) distribution",
    ]
    # Captions: file name · split · width×height · size.
    assert len(page.captions) == 4  # 2 samples for each of the 2 classes
    for caption in page.captions:
        name, split, size, nbytes = caption.split(" · ")
        assert re.fullmatch(r"[c서]\d\.(jpg|png)", name), caption
        assert split in ("train", "test") and re.fullmatch(r"\d+×30", size) and nbytes.endswith("B")


def test_samples_come_from_every_split_of_a_class(converted):
    stats = inspection.collect_stats(str(converted), samples_per_class=2)
    for key, samples in stats.samples.items():
        splits = {split for split, classes in stats.splits.items() if classes.get(key, None)}
        assert len(samples) == min(2, sum(stats.splits[s][key].records for s in splits))
        assert {split for _, _, split, _ in samples} == splits, key
    assert any(len({split for _, _, split, _ in s}) == 2 for s in stats.samples.values())  # the case is met


def test_keep_sample_spreads_the_samples_over_the_splits_as_they_come():
    kept: list = []
    for i in range(6):
        inspection.keep_sample(kept, (b"", f"train{i}", "train"), 4)
    for i in range(3):
        inspection.keep_sample(kept, (b"", f"val{i}", "validation"), 4)
    inspection.keep_sample(kept, (b"", "test0", "test"), 4)
    assert sorted(name for _, name, _ in kept) == ["test0", "train0", "val0", "val1"]


def test_the_images_charts_share_one_row_of_a_grid(converted, tmp_path, capsys):
    """Three columns that scale with the page, not flex items of fixed width that wrap (the
    height chart used to wrap alone onto a second row, leaving a blank gap beside it)."""
    report = tmp_path / "report.html"
    assert main.main(["inspect", str(converted), "--report", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert ".dist{display:grid;grid-template-columns:repeat(3,minmax(0,1fr))" in text
    section = text[text.index("<h2>Images</h2>") : text.index("<h2>Failures</h2>")]
    charts = re.findall(r'<svg [^>]*viewBox="0 0 (\d+) (\d+)"[^>]*width="100%"', section)
    assert len(charts) == 3, section[:500]


def test_report_without_failures_says_so(tmp_path, capsys):
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(images / "x.png")
    main.run(["--input", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"), "--quiet"], False)
    report = tmp_path / "r.html"
    assert main.main(["inspect", str(tmp_path / "out"), "--report", str(report)]) == 0
    assert "failed: none" in capsys.readouterr().out
    assert "<p>No image failed.</p>" in report.read_text()


def test_verify_and_inspect_print_no_tensorflow_log_lines(converted):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    for command in (["verify", str(converted)], ["inspect", str(converted)]):
        result = subprocess.run([str(SCRIPT), *command], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed")
def test_report_with_failures_and_captions_renders_in_chromium(converted, tmp_path, capsys):
    import numpy as np

    report, shot = tmp_path / "report.html", tmp_path / "shot.png"
    assert main.main(["inspect", str(converted), "--report", str(report)]) == 0
    chromium_screenshot(report, shot, 1000, 2600)
    with Image.open(shot) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int32)
    bars = (np.abs(pixels - [0x4A, 0x7B, 0xD0]).sum(axis=2) < 12).sum()
    assert bars > 9 * 100  # class bars of both splits and the three distributions
    dark = (pixels.sum(axis=2) < 200).sum(axis=1)  # text rows
    assert (dark > 0).sum() > 200  # headings, tables, failure rows and captions were drawn


def test_report_orders_numeric_ids_as_numbers_tells_lang_from_the_data_and_buckets_sizes_finely(
    converted, tmp_path, capsys
):
    """Class folders named by ids sort 1, 7, 42, 9999 (not 1, 42, 7, 9999); the page's `lang`
    comes from the class names (none for digits, 'ko' for Hangul); a 1,100-pixel side is in
    1025-1280, not 1025-2048."""
    images, out = tmp_path / "images", tmp_path / "out"
    for name, width in (("42", 8), ("7", 8), ("9999", 1100), ("1", 8)):
        (images / name).mkdir(parents=True)
        Image.new("RGB", (width, 8), (10, 20, 30)).save(images / name / "x.png")
    main.run(["--input", str(images), "--output_dir", str(out), "--quiet"], False)
    report = tmp_path / "ids.html"
    assert main.main(["inspect", str(out), "--report", str(report)]) == 0
    text_out = capsys.readouterr().out
    rows = [line.split()[0] for line in text_out.splitlines() if line.startswith("  ")]
    assert rows == ["1", "7", "42", "9999"]
    assert "widths (px): 1-16: 3, 1025-1280: 1" in text_out
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>\n<html><head>")  # digits tell no language
    headings = re.findall(r"<h3>(\d+)</h3><div class=\"sheet\">", page)
    assert headings == ["1", "7", "42", "9999"]
    assert re.findall(r"<td>(\d+)</td><td>1</td>", page) == ["1", "7", "42", "9999"]
    assert "1025-1280" in page

    korean = tmp_path / "korean.html"
    assert main.main(["inspect", str(converted), "--report", str(korean)]) == 0
    assert korean.read_text(encoding="utf-8").startswith('<!DOCTYPE html>\n<html lang="ko"><head>')
    assert inspection.page_lang(["cat", "dog"]) is None and inspection.page_lang(["ねこ", "犬"]) == "ja"
