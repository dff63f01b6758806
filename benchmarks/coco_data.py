"""Generated COCO-shaped data for the benchmarks: an instances JSON, and optionally its JPEGs.

Two kinds, each cached under `benchmarks/work/` with a `.complete` marker:

- `instances(images, per_image)`: the annotation file alone, as COCO's
  `instances_train2017.json` is shaped (118,287 images, 860,001 annotations, 80 of 90
  category ids used, ~7 boxes an image, polygons of ~24 vertices with two decimals, ~1% crowd
  annotations with an uncompressed RLE): ~450 MB at COCO's size. Written as a stream, so
  generating it holds one annotation at a time.
- `dataset(images)`: real JPEGs written with Pillow (320-640 px a side, photo-like noise:
  `dataset.make_jpeg`'s recipe) in `<root>/images/`, plus `<root>/instances.json` over them,
  the boxes and polygons inside each image's real size.

    python benchmarks/coco_data.py --instances 118287      # the COCO-sized file alone
    python benchmarks/coco_data.py --images 2000           # a dataset of 2,000 JPEGs
"""

from __future__ import annotations

import argparse
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

WORK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work")
_MARKER = ".complete"
# COCO's 80 categories have ids 1..90 with gaps (as instances_train2017.json lists them).
_UNUSED_IDS = {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
CATEGORY_IDS = [i for i in range(1, 91) if i not in _UNUSED_IDS]
BOXES_PER_IMAGE = 7.27  # 860,001 / 118,287
_VERTICES = 24
_CROWD_EVERY = 100


def categories() -> list[dict]:
    return [{"supercategory": "thing", "id": i, "name": f"class_{i:02d}"} for i in CATEGORY_IDS]


def _polygon(rng: np.random.Generator, x: float, y: float, w: float, h: float) -> list[float]:
    """A star-shaped polygon of _VERTICES vertices inside the box, two decimals a coordinate."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, _VERTICES))
    radii = rng.uniform(0.5, 1.0, _VERTICES)
    xs = x + w / 2 + np.cos(angles) * radii * w / 2
    ys = y + h / 2 + np.sin(angles) * radii * h / 2
    return [round(float(v), 2) for pair in zip(xs, ys) for v in pair]


def _rle(rng: np.random.Generator, width: int, height: int) -> dict:
    """An uncompressed RLE (COCO's crowd annotations) of ~200 runs over the image."""
    total = width * height
    cuts = np.sort(rng.choice(np.arange(1, total), 200, replace=False))
    counts = np.diff(np.concatenate([[0], cuts, [total]])).tolist()
    return {"counts": counts, "size": [height, width]}


def annotations_of(rng: np.random.Generator, image_id: int, width: int, height: int, first_id: int, n: int):
    """`n` annotations of one image: a box inside the image, its polygon (or a crowd RLE), area."""
    out = []
    for k in range(n):
        w = float(rng.uniform(8, width / 2))
        h = float(rng.uniform(8, height / 2))
        x = float(rng.uniform(0, width - w))
        y = float(rng.uniform(0, height - h))
        crowd = (first_id + k) % _CROWD_EVERY == 0
        segmentation = _rle(rng, width, height) if crowd else [_polygon(rng, x, y, w, h)]
        out.append(
            {
                "segmentation": segmentation,
                "area": round(w * h * 0.7, 4),
                "iscrowd": int(crowd),
                "image_id": image_id,
                "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                "category_id": CATEGORY_IDS[int(rng.integers(len(CATEGORY_IDS)))],
                "id": first_id + k,
            }
        )
    return out


def _counts(images: int, per_image: float, seed: int) -> np.ndarray:
    """Annotations per image: Poisson around `per_image`, total exactly round(images * per_image)."""
    rng = np.random.default_rng(seed)
    counts = rng.poisson(per_image, images)
    total = round(images * per_image)
    while counts.sum() != total:  # nudge to the exact total
        i = int(rng.integers(images))
        counts[i] += 1 if counts.sum() < total else -1 if counts[i] > 0 else 0
    return counts


def write_instances(
    path: str, sizes: list[tuple[str, int, int]], per_image: float = BOXES_PER_IMAGE, seed: int = 0
) -> int:
    """Writes a COCO instances JSON for images (file_name, width, height), streamed; returns
    the number of annotations. Top-level keys in COCO's order: info, licenses, images,
    annotations, categories (the categories come last, as in COCO's own files)."""
    counts = _counts(len(sizes), per_image, seed)
    rng = np.random.default_rng(seed + 1)
    dump = json.JSONEncoder(separators=(",", ":")).encode
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write('{"info":{"description":"generated"},"licenses":[],"images":[')
        for i, (name, width, height) in enumerate(sizes):
            f.write(
                ("," if i else "") + dump({"file_name": name, "height": height, "width": width, "id": i + 1})
            )
        f.write('],"annotations":[')
        next_id, first = 1, True
        for i, (_, width, height) in enumerate(sizes):
            for a in annotations_of(rng, i + 1, width, height, next_id, int(counts[i])):
                f.write(("" if first else ",") + dump(a))
                first = False
            next_id += int(counts[i])
        f.write('],"categories":' + dump(categories()) + "}")
    os.replace(path + ".part", path)
    return next_id - 1


def instances(images: int = 118_287, per_image: float = BOXES_PER_IMAGE, work_dir: str = WORK_DIR) -> str:
    """The path of a COCO-shaped annotation file of `images` images (no image files), cached."""
    folder = os.path.join(work_dir, f"coco-instances-{images}")
    path = os.path.join(folder, "instances.json")
    if os.path.exists(os.path.join(folder, _MARKER)):
        return path
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(7)
    sides = rng.integers(320, 641, (images, 2))
    sizes = [(f"{i + 1:012d}.jpg", int(w), int(h)) for i, (w, h) in enumerate(sides)]
    write_instances(path, sizes, per_image)
    open(os.path.join(folder, _MARKER), "w").close()
    return path


def make_jpeg(seed: int) -> tuple[bytes, int, int]:
    """One photo-like JPEG, 320-640 px a side (COCO's are up to 640), and its size."""
    rng = np.random.default_rng(seed)
    w, h = (int(v) for v in rng.integers(320, 641, 2))
    base = rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(base).resize((w, h), Image.BILINEAR), dtype=np.int16)
    noisy = smooth + rng.normal(0, 14, (h, w, 3)).astype(np.int16)
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue(), w, h


def _write_jpegs(folder: str, start: int, stop: int) -> list[tuple[str, int, int]]:
    sizes = []
    for i in range(start, stop):
        data, w, h = make_jpeg(1_000_003 + i)
        name = f"{i + 1:012d}.jpg"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        sizes.append((name, w, h))
    return sizes


def dataset(images: int, work_dir: str = WORK_DIR, workers: int | None = None) -> str:
    """The root of a COCO-shaped dataset of `images` JPEGs (`images/`, `instances.json`), cached.

    The first n images of a larger dataset are those of a smaller one (same seeds)."""
    root = os.path.join(work_dir, f"coco-{images}")
    if os.path.exists(os.path.join(root, _MARKER)):
        return root
    folder = os.path.join(root, "images")
    os.makedirs(folder, exist_ok=True)
    step = 500
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        starts = range(0, images, step)
        parts = pool.map(
            _write_jpegs, [folder] * len(starts), starts, [min(s + step, images) for s in starts]
        )
        sizes = [s for part in parts for s in part]
    write_instances(os.path.join(root, "instances.json"), sizes)
    open(os.path.join(root, _MARKER), "w").close()
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=0, help="images of an annotation-only file")
    parser.add_argument("--images", type=int, default=0, help="JPEGs of a dataset with its instances.json")
    parser.add_argument("--work_dir", default=WORK_DIR)
    args = parser.parse_args()
    if args.instances:
        print(instances(args.instances, work_dir=args.work_dir))
    if args.images:
        print(dataset(args.images, work_dir=args.work_dir))


if __name__ == "__main__":
    main()
