"""`img2tfrecord demo`: generate a small labelled image folder and convert it.

The dataset is made with Pillow (no download): three classes, one with a Korean name and
one with a space, mixed formats and modes, nested folders and two broken files, so the
output shows both written records and the failures file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
from collections.abc import Callable

from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "서울 광장")

# The two broken files are ~3% of the demo: a ratio that lets them fail, said out loud.
DEMO_FAILURE_RATIO = 0.1


def _draw(cls: str, rng: random.Random) -> Image.Image:
    w, h = rng.randint(48, 160), rng.randint(48, 160)
    img = Image.new("RGB", (w, h), tuple(rng.randint(0, 255) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    box = (w // 6, h // 6, w - w // 6, h - h // 6)
    colour = tuple(rng.randint(0, 255) for _ in range(3))
    if cls == "circle":
        draw.ellipse(box, fill=colour)
    elif cls == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([(box[0], box[3]), ((box[0] + box[2]) // 2, box[1]), (box[2], box[3])], fill=colour)
    return img


def generate(root: str, per_class: int = 20, seed: int = 0) -> int:
    """Writes the demo dataset under `root`; returns the number of files written."""
    rng = random.Random(seed)
    count = 0
    for cls in CLASSES:
        for i in range(per_class):
            img = _draw(cls, rng)
            sub = os.path.join(root, cls, "batch2" if i % 4 == 3 else "")
            os.makedirs(sub, exist_ok=True)
            if i % 5 == 1:
                img.convert("L").save(os.path.join(sub, f"{i:03d}.png"))
            elif i % 5 == 2:
                img.convert("P").save(os.path.join(sub, f"{i:03d}.gif"))
            else:
                img.save(os.path.join(sub, f"{i:03d}.JPG"), quality=90)
            count += 1
    for name, data in (
        (f"{CLASSES[0]}/truncated.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF"),
        (f"{CLASSES[1]}/page.jpg", b"<html>not an image</html>"),
    ):
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    return count + 2


def main(argv: list[str], convert: Callable[..., dict]) -> int:
    """The demo verb: `convert` is the entry point's run() (demo never imports the entry point)."""
    from beam_pipeline.cli.help import Formatter, prog_name
    from beam_pipeline.cli.options import DEFAULT_MAX_FAILURE_RATIO

    parser = argparse.ArgumentParser(
        prog=f"{prog_name()} demo",
        description="Generate a small image folder with Pillow (three classes, one with a Korean "
        "name, two broken files; no download) and convert it with a 80/20 train/validation split.",
        epilog="Other flags are passed to convert (e.g. --shard_size_mb 1, --runner ...).",
        formatter_class=Formatter,
    )
    parser.add_argument(
        "--data_dir", default="demo_data", help="Where the images are generated (kept if it exists)."
    )
    parser.add_argument("--output_dir", default="demo_out", help="Where the dataset is written (replaced).")
    parser.add_argument("--per_class", type=int, default=20, help="Images generated per class.")
    args, beam_args = parser.parse_known_args(argv)
    if not os.path.isdir(args.data_dir):
        generate(args.data_dir, args.per_class)
    flags = ["--input", args.data_dir, "--output_dir", args.output_dir, "--overwrite"]
    flags += ["--splits", "train=0.8,validation=0.2", "--max_failure_ratio", str(DEMO_FAILURE_RATIO)]
    flags += beam_args
    print(f"running: {prog_name()} convert {shlex.join(flags)}", flush=True)
    print(
        f"(--max_failure_ratio {DEMO_FAILURE_RATIO} lets the demo's two broken files fail; the default, "
        f"{DEFAULT_MAX_FAILURE_RATIO}, fails a run (exit 3, no dataset) when more than "
        f"{DEFAULT_MAX_FAILURE_RATIO:.0%} of its images fail)",
        flush=True,
    )
    summary = convert(flags)
    counts = {k: summary[k] for k in ("listed", "written", "failed", "written_per_class")}
    print(json.dumps(counts, ensure_ascii=False, indent=2))
    print(f"shards and metadata in {args.output_dir}/")
    return 0
