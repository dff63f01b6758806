"""The local input tree as users have it: hidden entries, folder links, deep trees, and files
that are not files in the pre-scan (--dedupe, re-encoding options)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import read_records, write_image
from transforms.images.read import ReadError
from transforms.images.types import ImageOptions
from transforms.layout.prescan import estimated, hash_and_header
from transforms.listing.local import is_hidden, is_listed, walk_folders, walk_local
from transforms.records import ImageRecord


def _convert(root: Path | str, out: Path, *flags: str) -> dict:
    return main.run(
        ["--input", str(root), "--output_dir", str(out), "--quiet", *flags], save_main_session=False
    )


def _failures(out: Path) -> dict[str, dict]:
    lines = (out / "failures.jsonl").read_text().splitlines()
    return {Path(f["path"]).name: f for f in map(json.loads, lines)}


def test_hidden_names():
    assert all(map(is_hidden, [".ipynb_checkpoints", ".DS_Store", "._a.jpg", "__MACOSX", ".git"]))
    assert not any(map(is_hidden, ["cat", "a.jpg", "MACOSX", "_a.jpg", "a.b.jpg"]))
    assert is_listed("cat/a.jpg") and is_listed("train/cat/x/a.jpg")
    assert not is_listed("cat/.ipynb_checkpoints/a-checkpoint.jpg")
    assert not is_listed("__MACOSX/cat/._a.jpg") and not is_listed(".hidden/a.jpg")


def test_hidden_folders_and_files_are_not_classes_nor_listed(tmp_path):
    root = tmp_path / "in"
    for cls in ("cat", "dog"):
        write_image(root / cls / "a.jpg", (8, 6), seed=len(cls))
    write_image(root / ".ipynb_checkpoints" / "a-checkpoint.jpg", (8, 6))
    write_image(root / "cat" / ".ipynb_checkpoints" / "a-checkpoint.jpg", (8, 6))
    (root / "__MACOSX" / "cat").mkdir(parents=True)
    (root / "__MACOSX" / "cat" / "._a.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (root / "cat" / "._a.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (root / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")

    summary = _convert(root, tmp_path / "out")

    assert (summary["listed"], summary["written"], summary["failed"]) == (2, 2, 0)
    assert (tmp_path / "out" / "labels.txt").read_text() == "cat\ndog\n"
    tfds_labels = (tmp_path / "out" / "image-class-label.labels.txt").read_text()
    assert tfds_labels == "cat\ndog\n"
    by_name = {r["filename"]: r["label"] for r in read_records(tmp_path / "out")}
    assert by_name == {"cat/a.jpg": [0], "dog/a.jpg": [1]}


def test_symlinked_class_folder_is_followed(tmp_path):
    root, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    write_image(root / "cat" / "a.jpg", (8, 6), seed=1)
    write_image(elsewhere / "dogs" / "b.jpg", (8, 6), seed=2)
    write_image(elsewhere / "dogs" / "sub" / "c.png", (8, 6), seed=3)
    (root / "dog").symlink_to(elsewhere / "dogs", target_is_directory=True)

    summary = _convert(root, tmp_path / "out")

    assert (tmp_path / "out" / "labels.txt").read_text() == "cat\ndog\n"
    assert (summary["listed"], summary["written"], summary["failed"]) == (3, 3, 0)
    names = sorted(r["filename"] for r in read_records(tmp_path / "out"))
    assert names == ["cat/a.jpg", "dog/b.jpg", "dog/sub/c.png"]


def test_folder_link_loops_are_not_followed_twice(tmp_path):
    root = tmp_path / "in"
    write_image(root / "cat" / "a.jpg", (8, 6))
    (root / "cat" / "again").symlink_to(root / "cat", target_is_directory=True)  # a loop
    (root / "cat" / "up").symlink_to(root, target_is_directory=True)  # a loop through the root
    files = [f.relpath for f in walk_local(str(root))]
    assert files == ["cat/a.jpg"]


def _remove_tree(top: str) -> None:
    """Removes a tree bottom-up without recursion (pytest's and shutil's rmtree recurse, and
    would fail on the deep tree when cleaning up old temporary folders)."""
    folders, stack = [], [top]
    while stack:
        folder = stack.pop()
        folders.append(folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for folder in reversed(folders):
        os.rmdir(folder)


def test_a_tree_1100_folders_deep(tmp_path):
    root = tmp_path / "in"
    write_image(root / "dog" / "b.png", (4, 4))
    deep = str(root / "cat")
    os.mkdir(deep)
    try:
        for _ in range(1100):  # one level at a time: Path.mkdir(parents=True) recurses
            deep += "/d"
            os.mkdir(deep)
        shutil.copy(root / "dog" / "b.png", deep + "/a.png")
        # os.walk (recursive in Python 3.11) raised RecursionError here.
        assert sum(len(names) for _, names in walk_folders(str(root))) == 2

        summary = _convert(root, tmp_path / "out")

        assert (summary["listed"], summary["written"], summary["failed"]) == (2, 2, 0)
        assert (tmp_path / "out" / "labels.txt").read_text() == "cat\ndog\n"
    finally:
        _remove_tree(str(root / "cat"))


def _special_files(folder: Path) -> list[Path]:
    """A FIFO and a character device named like images (a link to /dev/zero where mknod is refused)."""
    fifo = folder / "fifo.jpg"
    os.mkfifo(fifo)
    device = folder / "zero.jpg"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except OSError:
        device.symlink_to("/dev/zero")
    return [fifo, device]


def _finishes(fn, *args, seconds: float = 120):
    """Runs fn(*args) in a thread; returns its result, or fails the test if it hangs."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} hung on a FIFO or device")
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_prescan_refuses_fifos_and_devices_without_waiting(tmp_path):
    for path in _special_files(tmp_path):
        with pytest.raises(ReadError, match="not a regular file"):
            _finishes(hash_and_header, str(path), seconds=20)
        record = ImageRecord(path=str(path), relpath=path.name, size=0, labels=("x",))
        assert _finishes(estimated, record, ImageOptions(max_side=4), seconds=20) == record


@pytest.mark.parametrize("flags", [["--dedupe"], ["--max_side", "4"]], ids=["dedupe", "max_side"])
def test_fifo_and_device_are_named_failures_with_prescan(tmp_path, flags):
    root = tmp_path / "in"
    write_image(root / "cat" / "a.jpg", (8, 6))
    specials = _special_files(root / "cat")
    out = tmp_path / "out"
    try:
        summary = _finishes(_convert, root, out, "--max_failure_ratio", "1", *flags)
    finally:
        for path in specials:  # release a reader stuck on the FIFO (before the fix)
            if path.is_fifo():
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
    assert (summary["listed"], summary["written"], summary["failed"]) == (3, 1, 2)
    failures = _failures(out)
    assert set(failures) == {"fifo.jpg", "zero.jpg"}
    assert all("not a regular file" in f["reason"] for f in failures.values())


def test_hidden_entries_are_not_listed_from_gcs_either(gcs_bucket, tmp_path):
    from tests.gcs_emulator import BUCKET, upload_tree

    root = tmp_path / "in"
    for cls in ("cat", "dog"):
        write_image(root / cls / "a.jpg", (8, 6), seed=len(cls))
    write_image(root / ".ipynb_checkpoints" / "a-checkpoint.jpg", (8, 6))
    (root / "__MACOSX" / "cat").mkdir(parents=True)
    (root / "__MACOSX" / "cat" / "._a.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    (root / "dog" / "._a.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    upload_tree(gcs_bucket, root, "hidden")

    summary = _convert(f"gs://{BUCKET}/hidden", tmp_path / "out")

    assert (tmp_path / "out" / "labels.txt").read_text() == "cat\ndog\n"
    assert (summary["listed"], summary["written"], summary["failed"]) == (2, 2, 0)
