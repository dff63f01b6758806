"""Drawing a sample's objects for `inspect`'s report (pure): its boxes outlined in their class's
colour with the class name, its instance masks and class map as a translucent layer, over the
image's thumbnail, as one inline SVG (the page stays one self-contained file).

In: an encoded image (its `thumbnail`: first frame, RGB or RGBA) and the sample's objects as
the records hold them (transforms/verify/shards.py SampleObjects: boxes as fractions, class
indices, PNG masks and class map). Out: SVG text. Colours: Tableau's 10 for classes, Pascal VOC's palette for class maps
(the colours VOC's and DeepLab's map PNGs are shown in).
"""

from __future__ import annotations

import base64
import html
import io

from PIL import Image

from transforms.images.masks import IGNORE_CLASS
from transforms.verify.shards import SampleObjects

OBJECT_THUMBNAIL_PX = 256  # large enough to read the boxes' class names


def thumbnail(data: bytes, size: int) -> tuple[Image.Image, tuple[int, int]]:
    """The first frame of an encoded image, shrunk to fit `size` (RGB, or RGBA when it has
    transparency), and the image's (width, height)."""
    with Image.open(io.BytesIO(data)) as img:
        img.seek(0)
        original = img.size
        frame = img.convert("RGBA" if "A" in img.getbands() or img.mode == "P" else "RGB")
    frame.thumbnail((size, size))
    return frame, original


# Boxes and instance masks: Tableau's 10 categorical colours (matplotlib's tab10), by class index.
BOX_COLOURS = tuple(
    tuple(int(c[i : i + 2], 16) for i in (0, 2, 4))
    for c in "1f77b4 ff7f0e 2ca02c d62728 9467bd 8c564b e377c2 7f7f7f bcbd22 17becf".split()
)


def box_colour(cls: int) -> tuple[int, int, int]:
    """The colour of the boxes and masks of class index `cls`."""
    return BOX_COLOURS[cls % len(BOX_COLOURS)]


def class_colour(value: int) -> tuple[int, int, int]:
    """Pascal VOC's colour of class map value `value` (1: dark red, 2: green, 3: olive, ...), the
    palette of VOC's and DeepLab's class map PNGs."""
    r = g = b = 0
    for bit in range(8):
        r |= (value & 1) << (7 - bit)
        g |= (value >> 1 & 1) << (7 - bit)
        b |= (value >> 2 & 1) << (7 - bit)
        value >>= 3
    return r, g, b


_OVERLAY_ALPHA = 0.45  # the opacity of masks and class maps over the image


def overlay_png(drawn: SampleObjects, size: tuple[int, int]) -> bytes | None:
    """The translucent layer of a sample's class map and instance masks at `size` (PNG, RGBA), or
    None when it has neither. The class map in VOC's colours, its values 0 (background) and 255
    (ignore) clear; each mask in its object's box colour."""
    import numpy as np

    layer = Image.new("RGBA", size, (0, 0, 0, 0))
    if drawn.class_map is not None:
        with Image.open(io.BytesIO(drawn.class_map)) as img:
            values = np.asarray(img.convert("L").resize(size, Image.Resampling.NEAREST))
        table = np.array([(*class_colour(v), round(255 * _OVERLAY_ALPHA)) for v in range(256)], np.uint8)
        table[[0, IGNORE_CLASS], 3] = 0
        layer = Image.fromarray(table[values], "RGBA")
    for png, cls in zip(drawn.masks, drawn.classes, strict=False):  # masks: none, or one an object
        with Image.open(io.BytesIO(png)) as img:
            # Coverage of each thumbnail pixel (a box filter of the 0/1 mask), scaled to the opacity.
            mask = img.convert("L").point(lambda v: 255 if v else 0).resize(size, Image.Resampling.BOX)
        colour = Image.new("RGBA", size, (*box_colour(cls), 0))
        colour.putalpha(mask.point(lambda v: round(v * _OVERLAY_ALPHA)))
        layer = Image.alpha_composite(layer, colour)
    if drawn.class_map is None and not drawn.masks:
        return None
    out = io.BytesIO()
    layer.save(out, format="PNG")
    return out.getvalue()


def objects_svg(
    frame: Image.Image, size: tuple[int, int], drawn: SampleObjects, names: list[str], label: str
) -> str:
    """A sample as one inline SVG: the image (a JPEG thumbnail, PNG with transparency), its masks
    and class map as a translucent layer, and each box outlined in its class colour with its class
    name; drawn at OBJECT_THUMBNAIL_PX on the longest side (small images are enlarged).
    `frame`: the image's thumbnail (`thumbnail`), `size`: the image's (width, height)."""
    width, height = size
    scale = OBJECT_THUMBNAIL_PX / max(width, height)
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    out = io.BytesIO()
    if frame.mode == "RGBA":
        frame.save(out, format="PNG")
        mime = "png"
    else:  # JPEG: a photo's thumbnail is far smaller than as PNG (a page holds samples x classes)
        frame.save(out, format="JPEG", quality=85)
        mime = "jpeg"
    e = html.escape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="objects" role="img" aria-label="{e(label)}" '
        f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        f'<image href="data:image/{mime};base64,{base64.b64encode(out.getvalue()).decode()}" '
        f'width="{w}" height="{h}" preserveAspectRatio="none"/>',
    ]
    layer = overlay_png(drawn, (w, h))
    if layer is not None:
        parts.append(
            f'<image class="overlay" href="data:image/png;base64,{base64.b64encode(layer).decode()}" '
            f'width="{w}" height="{h}" preserveAspectRatio="none"/>'
        )
    for (x0, y0, x1, y1), cls in zip(drawn.boxes, drawn.classes, strict=True):
        name = e(names[cls])  # in the class names: verify's checks
        colour = "#{:02x}{:02x}{:02x}".format(*box_colour(cls))
        x, y, bw, bh = x0 * w, y0 * h, (x1 - x0) * w, (y1 - y0) * h
        text_y = y - 3 if y >= 12 else y + 11  # above the box, or inside it at the top edge
        parts.append(
            f'<g class="box" data-class="{name}"><title>{name}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" fill="none" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text x="{x + 2:.1f}" y="{text_y:.1f}" fill="{colour}" stroke="#fff" stroke-width="3" '
            f'paint-order="stroke">{name}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)
