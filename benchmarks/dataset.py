"""Generated benchmark datasets: JPEGs in class folders, made with Pillow, cached on disk.

The default matches issue 8: 16,000 JPEGs in 10 class folders, 200-400 px a side, about
700 MB. Content is a smooth colour field plus noise, so files are of photo-like size
(~45 KB at quality 90) and every one is different. A dataset is generated once per
(count, seed) and reused: `<work>/data-<count>-<seed>/` with a `.complete` marker.
"""

from __future__ import annotations

import argparse
import io
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

WORK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work")
NUM_CLASSES = 10
MIN_SIDE, MAX_SIDE = 200, 400
_NOISE_SIGMA = 14
_QUALITY = 90
_MARKER = ".complete"


def make_jpeg(seed: int) -> bytes:
    """One JPEG, 200-400 px a side, fully determined by `seed`."""
    rng = np.random.default_rng(seed)
    w, h = (int(v) for v in rng.integers(MIN_SIDE, MAX_SIDE + 1, 2))
    base = rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(base).resize((w, h), Image.BILINEAR), dtype=np.int16)
    noisy = smooth + rng.normal(0, _NOISE_SIGMA, (h, w, 3)).astype(np.int16)
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=_QUALITY)
    return buf.getvalue()


def image_path(root: str, index: int) -> str:
    return os.path.join(root, f"class_{index % NUM_CLASSES:02d}", f"img_{index:06d}.jpg")


def _write_range(root: str, start: int, stop: int, seed: int) -> int:
    total = 0
    for i in range(start, stop):
        data = make_jpeg(seed * 1_000_003 + i)
        with open(image_path(root, i), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def generate(count: int, seed: int = 0, work_dir: str = WORK_DIR, workers: int | None = None) -> str:
    """Returns the folder of a dataset of `count` JPEGs, generating it if not cached.

    The first `n` images of a larger dataset with the same seed are the images of the
    smaller one, so 1x and 4x datasets hold comparable content.
    """
    root = os.path.join(work_dir, f"data-{count}-{seed}")
    if os.path.exists(os.path.join(root, _MARKER)):
        return root
    for c in range(NUM_CLASSES):
        os.makedirs(os.path.join(root, f"class_{c:02d}"), exist_ok=True)
    workers = workers or os.cpu_count() or 1
    step = max(1, -(-count // (workers * 8)))
    with ProcessPoolExecutor(workers) as pool:
        futures = [
            pool.submit(_write_range, root, s, min(count, s + step), seed) for s in range(0, count, step)
        ]
        total = sum(f.result() for f in futures)
    with open(os.path.join(root, _MARKER), "w") as f:
        f.write(f"{count} images, {total} bytes\n")
    return root


def subset(count: int, of: int, seed: int = 0, work_dir: str = WORK_DIR) -> str:
    """A dataset of the first `count` images of the `of`-image one, as hard links (no copies)."""
    full = generate(of, seed, work_dir)
    root = os.path.join(work_dir, f"subset-{count}-of-{of}-{seed}")
    if os.path.exists(os.path.join(root, _MARKER)):
        return root
    for c in range(NUM_CLASSES):
        os.makedirs(os.path.join(root, f"class_{c:02d}"), exist_ok=True)
    for i in range(count):
        target = image_path(root, i)
        if not os.path.exists(target):
            os.link(image_path(full, i), target)
    with open(os.path.join(root, _MARKER), "w") as f:
        f.write(f"first {count} images of {full}\n")
    return root


def dataset_bytes(root: str) -> tuple[int, int]:
    """(number of files, total bytes) of the images under `root`."""
    n = total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".jpg"):
                n += 1
                total += os.path.getsize(os.path.join(dirpath, name))
    return n, total


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = generate(args.count, args.seed)
    n, size = dataset_bytes(path)
    print(f"{path}: {n} images, {size / 1e6:.0f} MB")
