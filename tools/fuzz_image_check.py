"""Fuzz the image check against TensorFlow's decoder (a developer tool, not part of the suite).

Mutates small valid JPEG/PNG/GIF/BMP files (and animated PNG/GIF) at random and reports
  - exceptions other than ImageError escaping `inspect_image` (they would crash a job), and
  - images the checks (`inspect_image`, `check_structure`) accept that `tf.io.decode_image(..., expand_animations=False)`
    rejects or decodes to another shape (they would be written and break training).

    .venv/bin/python tools/fuzz_image_check.py --cases 5000 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import io
import random
import warnings

from PIL import Image

from transforms.image import ImageError, inspect_image
from transforms.integrity import check_structure


def seeds() -> list[bytes]:
    out = []
    for fmt, mode in [
        ("JPEG", "RGB"),
        ("JPEG", "L"),
        ("PNG", "RGBA"),
        ("PNG", "P"),
        ("PNG", "L"),
        ("GIF", "P"),
    ]:
        buf = io.BytesIO()
        Image.effect_noise((33, 21), 50).convert(mode).save(buf, format=fmt)
        out.append(buf.getvalue())
    buf = io.BytesIO()
    Image.effect_noise((33, 21), 50).convert("RGB").save(buf, format="BMP")
    out.append(buf.getvalue())
    frames = [Image.new("RGB", (9, 9), (i * 50, 0, 0)) for i in range(3)]
    for fmt in ("PNG", "GIF"):
        buf = io.BytesIO()
        frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:])
        out.append(buf.getvalue())
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    d = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        p, op = rng.randrange(len(d)), rng.random()
        if op < 0.6:
            d[p] = rng.randrange(256)
        elif op < 0.8:
            del d[p : p + rng.randint(1, 50)]
        else:
            d[p:p] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
    return bytes(d)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import tensorflow as tf

    warnings.simplefilter("ignore")
    rng = random.Random(args.seed)
    corpus = seeds()
    escaped: collections.Counter = collections.Counter()
    disagree: collections.Counter = collections.Counter()
    example: dict = {}
    accepted = 0
    for _ in range(args.cases):
        data = mutate(rng.choice(corpus), rng)
        try:
            info = inspect_image(data)
            check_structure(info.format, data)
        except ImageError:
            continue
        except Exception as e:  # noqa: BLE001 - that is what we are looking for
            escaped[type(e).__name__] += 1
            continue
        accepted += 1
        try:
            shape = tuple(tf.io.decode_image(data, expand_animations=False).shape)
        except tf.errors.InvalidArgumentError as e:
            disagree[(info.format, "tensorflow rejects")] += 1
            example.setdefault((info.format, "tensorflow rejects"), str(e).splitlines()[0][-120:])
            continue
        if shape != (info.height, info.width, info.channels):
            key = (info.format, "other shape")
            disagree[key] += 1
            example.setdefault(key, f"checked {info.height}x{info.width}x{info.channels}, tensorflow {shape}")
    print(f"{args.cases} mutated files, {accepted} accepted by the checks")
    print(f"exceptions escaping inspect_image: {dict(escaped) or 'none'}")
    print(f"accepted but not what TensorFlow decodes: {dict(disagree) or 'none'}")
    for key, text in example.items():
        print(f"  e.g. {key}: {text}")


if __name__ == "__main__":
    main()
