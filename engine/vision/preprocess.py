"""Image bytes -> the encoder's input pixels, exactly as llama.cpp's mtmd prepares them.

    decode      Pillow: PNG, JPEG, WebP, GIF (first frame), ... -> RGB u8 (alpha dropped);
                an image over PIXEL_BUDGET is reduced by the smallest whole factor that fits
                it (box filter; JPEG decodes at a reduced scale); one whose header says more
                than BOMB_PIXELS is refused before anything is allocated (a decompression bomb)
    resize      per projector (below); llama.cpp's resizer is a port of Pillow's, so Pillow's
                Image.resize reproduces its pixels bit for bit (the vlm references check it)
    normalise   x / 255, then (x - mean) / std with the file's mean/std, f32, planar [3, H, W]

The rules, one per projector type:
    gemma3    fit into image_size x image_size keeping the aspect (new side = ceil(side * scale),
              float32 scale), BILINEAR, centred on black
    mlp       the same with BICUBIC, centred on CLIP's mean colour (122, 116, 104)
    idefics3  longest side -> preproc_image_size (the other int(L / aspect), made even), LANCZOS;
              again LANCZOS up to multiples of image_size; cut tiles row by row; then the
              overview: the refined image LANCZOS-resized to image_size, last
An image already at the target size is used as it is. Only images over the budget differ from
mtmd's pixels (mtmd resizes the full decoded image; here it was scaled down once before).
"""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from engine.vision.mmproj import VisionParams

# pixels an image keeps when decoded: larger ones are scaled down to fit (every projector's
# input is far smaller: Gemma 3 896x896, SmolVLM's tiles at most a few Mpx)
PIXEL_BUDGET = 40_000_000
# pixels a header may claim at all: beyond (a decompression bomb, ~1 GB of RGB) refused undecoded
BOMB_PIXELS = 300_000_000
_MLP_PAD = (122, 116, 104)


class ImageError(ValueError):
    """An image that cannot be used: undecodable, truncated, or too large."""


@dataclass(frozen=True)
class Preprocessed:
    """The encoder inputs of one image: one or more tiles and their grid (for the markers)."""
    tiles: tuple[np.ndarray, ...]   # each float32 [3, image_size, image_size]
    grid: tuple[int, int]           # (rows, cols) of tiles before the overview; (0, 0): none


def reduce_factor(size: tuple[int, int], budget: int | None = None) -> int:
    """The smallest integer factor that brings `size` within `budget` pixels (1: it fits)."""
    w, h = size
    budget = PIXEL_BUDGET if budget is None else budget
    f = max(1, math.ceil(math.sqrt(w * h / budget)))
    while math.ceil(w / f) * math.ceil(h / f) > budget:
        f += 1
    return f


def decode(data: bytes) -> Image.Image:
    """RGB image from encoded bytes, within PIXEL_BUDGET; ImageError says why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # BOMB_PIXELS rules
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > BOMB_PIXELS:  # read at call time (tests lower them)
                raise ImageError(f"image is {img.width}x{img.height}: over {BOMB_PIXELS} pixels, "
                                 "refused as a decompression bomb")
            img.seek(0)  # an animation's first frame, as mtmd's stb_image takes
            f = reduce_factor(img.size)
            if f > 1:  # JPEG: decode at 1/2, 1/4 or 1/8 scale, still at least the reduced size
                img.draft("RGB", (math.ceil(img.width / f), math.ceil(img.height / f)))
            img.load()
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError,
            MemoryError) as e:
        raise ImageError(f"cannot decode the image ({e})") from None
    if img.width < 1 or img.height < 1:
        raise ImageError("image has no pixels")
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    f = reduce_factor(rgb.size)
    # a box filter by a whole factor: one cheap pass (a 64 Mpx image: 4000x4000 in well under
    # a second), where a resampling filter over the full image takes many seconds
    return rgb.reduce(f) if f > 1 else rgb


def normalise(img: Image.Image, hp: VisionParams) -> np.ndarray:
    """RGB u8 -> float32 [3, H, W]: (x / 255 - mean) / std in f32, as mtmd's normalize_image_u8_to_f32."""
    x: np.ndarray = np.asarray(img, dtype=np.float32) / np.float32(255)   # [H, W, 3]
    y: np.ndarray = (x - np.asarray(hp.mean, np.float32)) / np.asarray(hp.std, np.float32)
    return np.ascontiguousarray(y.transpose(2, 0, 1), dtype=np.float32)


def fit_and_pad(img: Image.Image, side: int, resample: Image.Resampling,
                colour: tuple[int, int, int]) -> Image.Image:
    if img.size == (side, side):
        return img
    w, h = img.size
    scale = min(np.float32(side) / np.float32(w), np.float32(side) / np.float32(h))
    nw = min(math.ceil(float(np.float32(w) * scale)), side)
    nh = min(math.ceil(float(np.float32(h) * scale)), side)
    canvas = Image.new("RGB", (side, side), colour)
    canvas.paste(img.resize((nw, nh), resample), ((side - nw) // 2, (side - nh) // 2))
    return canvas


def _resize(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    return img if img.size == size else img.resize(size, Image.Resampling.LANCZOS)


def tile(img: Image.Image, side: int, longest: int) -> tuple[list[Image.Image], tuple[int, int]]:
    """idefics3's tiles (row by row) and their grid, then the overview as the last image."""
    w, h = img.size
    if w >= h:
        nw, nh = longest, int(longest / (w / h))
        nh += nh % 2
    else:
        nw, nh = int(longest / (h / w)), longest
        nw += nw % 2
    nw, nh = max(nw, 1), max(nh, 1)
    refined = _resize(img, (nw, nh))
    rows, cols = math.ceil(nh / side), math.ceil(nw / side)
    refined = _resize(refined, (cols * side, rows * side))
    tiles = [refined.crop((x * side, y * side, (x + 1) * side, (y + 1) * side))
             for y in range(rows) for x in range(cols)]
    return tiles + [_resize(refined, (side, side))], (rows, cols)


def preprocess(img: Image.Image, hp: VisionParams) -> Preprocessed:
    side = hp.image_size
    if hp.projector == "gemma3":
        images, grid = [fit_and_pad(img, side, Image.Resampling.BILINEAR, (0, 0, 0))], (0, 0)
    elif hp.projector == "mlp":
        images, grid = [fit_and_pad(img, side, Image.Resampling.BICUBIC, _MLP_PAD)], (0, 0)
    elif hp.projector == "idefics3" and hp.preproc_image_size:
        images, grid = tile(img, side, hp.preproc_image_size)
    elif hp.projector == "idefics3":
        images, grid = [_resize(img, (side, side))], (0, 0)
    else:
        raise ValueError(f"no preprocessing for projector {hp.projector!r}")
    return Preprocessed(tuple(normalise(i, hp) for i in images), grid)
