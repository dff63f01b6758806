"""images/geometry.py: the one description of resize, pad, crop, JPEG scale-down and EXIF rotation.

The pixels follow it exactly as Pillow's ImageOps did (the bytes are the same), and a point of the
stored image lands where `map_points` says, for every orientation and JPEG reduction.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image, ImageOps

from transforms.images.geometry import (
    TRANSPOSITIONS,
    Geometry,
    oriented_size,
    plan_geometry,
    unorient_boxes,
)
from transforms.images.types import ImageOptions

BICUBIC = Image.Resampling.BICUBIC
SIZES = [(1001, 500), (333, 777), (640, 480), (17, 9), (100, 100), (3, 1000)]
TARGETS = [(100, 100), (64, 48), (300, 50), (1500, 900), (7, 3)]


def _random(size: tuple[int, int], seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("size, target", list(itertools.product(SIZES, TARGETS)))
def test_pixels_through_the_geometry_are_imageops_pixels(size, target):
    """pad = ImageOps.pad, crop = ImageOps.fit, stretch = resize: what the conversion used before,
    so classification output keeps its bytes."""
    img = _random(size)
    expected = {
        "pad": lambda: ImageOps.pad(img, target, BICUBIC, color=0),
        "crop": lambda: ImageOps.fit(img, target, BICUBIC),
        "stretch": lambda: img.resize(target, BICUBIC),
    }
    for mode, reference in expected.items():
        geometry = plan_geometry(*size, 1, ImageOptions(resize=target, resize_mode=mode))
        try:
            want = reference()
        except ValueError:  # a side rounds to 0 in ImageOps.contain: test_a_side_never_rounds_to_0
            assert mode == "pad" and size == (3, 1000), (mode, size)
            continue
        got = geometry.apply_to_image(img, BICUBIC)
        assert got.size == want.size == geometry.size
        assert got.tobytes() == want.tobytes(), mode


@pytest.mark.parametrize("size", [(3, 1000), (1000, 3), (1, 20), (20, 1)])
@pytest.mark.parametrize("target", [(100, 100), (64, 48), (7, 3), (10, 10)])
def test_a_side_never_rounds_to_0(size, target):
    """A 3x1000 image padded into 100x100: ImageOps.pad rounds its width to 0 and raises
    (Pillow issue 9997); the geometry keeps the side at 1 pixel (as Image.thumbnail and
    --max_side do), centred in the bands as ImageOps.pad centres, and its boxes follow."""
    img = _random(size)
    geometry = plan_geometry(*size, 1, ImageOptions(resize=target, resize_mode="pad"))
    out = geometry.apply_to_image(img, BICUBIC)
    assert out.size == geometry.size == target and min(geometry.resized) >= 1
    # Where the image's pixels went: the part that is not the black bands.
    content = np.nonzero(np.asarray(out).any(axis=2))
    rows, cols = content
    x0, y0, x1, y1 = geometry.map_boxes(np.array([[0, 0, *size]]))[0]
    assert (cols.min(), cols.max() + 1, rows.min(), rows.max() + 1) == (x0, x1, y0, y1)
    if (size, target) == ((3, 1000), (100, 100)):
        assert (geometry.resized, geometry.offset) == ((1, 100), (50, 0))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_sliver_converts_to_a_padded_image_with_its_column(fmt):
    """The conversion the writer runs (JPEG scale-down included) on a 3x1000 red sliver with
    --resize 100x100 (pad): a 100x100 image, red only in the middle column (was: a ValueError
    that is not an ImageError, which crashed the job)."""
    import io

    import tensorflow as tf

    from transforms.images.convert import prepare_image

    data = io.BytesIO()
    Image.new("RGB", (3, 1000), (220, 0, 0)).save(data, fmt)
    prepared = prepare_image(data.getvalue(), ImageOptions(resize=(100, 100), resize_mode="pad"))
    pixels = tf.io.decode_image(prepared.data).numpy().astype(int)
    assert pixels.shape == (100, 100, 3)
    red = pixels[..., 0].mean(axis=0)  # per column (a re-encoded JPEG bleeds a little beside it)
    assert red.argmax() == 50 and red[50] > 100
    assert (red[:45] < 10).all() and (red[56:] < 10).all()  # the bands


def test_max_side_scales_down_only():
    assert plan_geometry(1000, 500, 1, ImageOptions(max_side=100)).size == (100, 50)
    assert plan_geometry(50, 40, 1, ImageOptions(max_side=100)).is_identity
    assert plan_geometry(640, 480, 1, ImageOptions()).is_identity


def _dot_image(size, x, y):
    img = Image.new("L", size, 0)
    img.putpixel((x, y), 255)
    return img


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("reduce", [1, 4])
def test_a_stored_pixel_lands_where_map_points_says(orientation, reduce):
    """One bright pixel of the reduced image, transposed by Pillow: its centre in the written
    image is `map_points` of its centre in the stored image."""
    width, height = 41 * reduce - 1, 23 * reduce - 2  # the reduced frame has padding
    geometry = plan_geometry(width, height, orientation, ImageOptions(), reduce)
    dw, dh = geometry.reduced
    for u, v in [(0, 0), (5, 17), (dw - 1, 0), (13, dh - 1)]:
        reduced = _dot_image(geometry.reduced, u, v)
        out = np.asarray(geometry.apply_to_image(reduced, Image.Resampling.NEAREST))
        (row,), (col,) = np.nonzero(out)
        x, y = geometry.map_points(np.array([(u + 0.5) * reduce]), np.array([(v + 0.5) * reduce]))
        assert (x[0], y[0]) == pytest.approx((col + 0.5, row + 0.5))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_rasters_follow_the_same_steps_as_the_pixels(orientation):
    """A mask at the stored size through `apply_to_raster` covers what the image's pixels cover."""
    width, height, reduce = 203, 101, 2
    options = ImageOptions(resize=(60, 40), resize_mode="crop")
    geometry = plan_geometry(width, height, orientation, options, reduce)
    mask = Image.new("L", (width, height), 0)
    mask.paste(1, (20, 10, 120, 60))
    out = np.asarray(geometry.apply_to_raster(mask))
    box = geometry.map_boxes(np.array([[20, 10, 120, 60]]))[0]
    rows, cols = np.nonzero(out)
    x0, y0, x1, y1 = np.clip(box, 0, [60, 40, 60, 40])
    assert cols.min() == pytest.approx(x0, abs=1) and cols.max() + 1 == pytest.approx(x1, abs=1)
    assert rows.min() == pytest.approx(y0, abs=1) and rows.max() + 1 == pytest.approx(y1, abs=1)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_upright_boxes_go_back_to_the_stored_frame(orientation):
    width, height = 300, 200
    boxes = np.array([[10.0, 20.0, 50.0, 120.0], [0, 0, width, height]])
    upright = plan_geometry(width, height, orientation, ImageOptions()).map_boxes(boxes)
    assert (
        oriented_size(width, height, orientation)
        == plan_geometry(width, height, orientation, ImageOptions()).size
    )
    np.testing.assert_allclose(unorient_boxes(upright, width, height, orientation), boxes)


def test_pad_and_crop_windows():
    pad = plan_geometry(200, 100, 1, ImageOptions(resize=(100, 100), resize_mode="pad"))
    assert (pad.resized, pad.offset, pad.crops) == ((100, 50), (0, 25), False)
    np.testing.assert_allclose(pad.map_boxes(np.array([[0, 0, 200, 100]])), [[0, 25, 100, 75]])
    crop = plan_geometry(200, 100, 1, ImageOptions(resize=(100, 100), resize_mode="crop"))
    assert crop.window == (50.0, 0.0, 150.0, 100.0) and crop.crops
    np.testing.assert_allclose(crop.map_boxes(np.array([[50, 0, 150, 100]])), [[0, 0, 100, 100]])
    assert Geometry.identity(3, 2).scale == (1.0, 1.0)
    assert set(TRANSPOSITIONS) == set(range(2, 9))
