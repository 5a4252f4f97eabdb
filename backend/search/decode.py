"""Uploaded images decoded within a memory budget.

A compressed file says little about what it costs once decoded: a 77 KB 16-bit PNG of
6300 x 6300 pixels is 79 MB decoded, and the model paths' conversions (8-bit RGB, float) at
full size multiplied that to about 1 GB per upload. So:

1. the format and pixel count are checked from the header, before decoding (415/422);
2. what the decode will hold is estimated from the header (:func:`decode_cost`) and reserved
   from a budget shared by all requests (:class:`MemoryBudget`); decodes beyond it wait;
3. JPEG is decoded directly at a reduced scale (``draft``: the DCT scaling of libjpeg); PNG has
   no reduced decode, so it is decoded at full size in its own mode and reduced at once;
4. the image handed to the models is at most ``max_side`` pixels on its longer side, still in
   its own mode: every conversion (to 8-bit RGB, float) happens on the reduced image.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from PIL import Image, UnidentifiedImageError

from aoq_serve.errors import ServiceError

ACCEPTED_FORMATS = ("PNG", "JPEG")
#: bytes per pixel of Pillow's in-memory storage; every other mode takes 4.
_STORED_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}
#: modes Pillow's resize converts to a premultiplied copy first (``Image.resize``: LA -> La, RGBA -> RGBa).
_PREMULTIPLIED = frozenset({"LA", "RGBA"})


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return None


_TRIM = _malloc_trim()


def return_freed_memory() -> None:
    """Give freed heap memory back to the system. Pillow allocates decodes in blocks that glibc
    serves from its per-thread heaps once its mmap threshold has grown; freed, they stay resident
    (1.6 GB after repeated concurrent uploads) until trimmed."""
    if _TRIM is not None:
        _TRIM(0)


class MemoryBudget:
    """A counting semaphore over bytes: reservations wait until what they ask for is free.

    A reservation larger than the whole budget waits until nothing else is reserved and then
    takes the whole budget, so it runs alone instead of never.
    """

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self.in_use = 0
        self._cond = threading.Condition()

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold ``nbytes`` of the budget for the duration of the ``with`` block."""
        take = min(nbytes, self.total)
        with self._cond:
            self._cond.wait_for(lambda: self.in_use + take <= self.total)
            self.in_use += take
        try:
            yield
        finally:
            with self._cond:
                self.in_use -= take
                idle = self.in_use == 0
                self._cond.notify_all()
            if idle:
                return_freed_memory()


def _target_size(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """``size`` scaled down (aspect ratio kept) so that its longer side is at most ``max_side``."""
    width, height = size
    scale = max_side / max(width, height, 1)
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def decode_cost(image: Image.Image, max_side: int) -> int:
    """Bytes a decode of ``image`` (opened, not yet loaded, after any ``draft``) holds at its peak:
    the full-size buffer in the stored mode; when it is reduced, the buffers Pillow's resize makes
    on the way (a premultiplied full-size copy for the alpha modes, the first pass's rows of the
    reduced width and full height); the reduced copy (at most 4 bytes a pixel, twice for the
    alpha modes: premultiplied, then converted back)."""
    width, height = image.size
    reduced_w, reduced_h = _target_size(image.size, max_side)
    stored = _STORED_BYTES.get(image.mode, 4)
    cost = width * height * stored + reduced_w * reduced_h * 4
    if (reduced_w, reduced_h) == (width, height):
        return cost
    premultiplied = image.mode in _PREMULTIPLIED
    working = 4 if premultiplied else stored
    cost += reduced_w * height * working
    if premultiplied:
        cost += width * height * 4 + reduced_w * reduced_h * 4
    return cost


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """Open (parse the header of) an upload and check its format and pixel count."""
    if not data:
        raise ServiceError(422, "the uploaded file is empty")
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ServiceError(422, f"image refused as a possible decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ServiceError(422, "the uploaded file is not an image (PNG or JPEG expected)") from None
    if image.format not in ACCEPTED_FORMATS:
        raise ServiceError(415, f"the uploaded image is {image.format or 'of an unknown format'}; PNG or JPEG expected")
    width, height = image.size
    if width * height > max_pixels:
        raise ServiceError(
            422,
            f"the uploaded image has {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels} (possible decompression bomb)",
        )
    return image


def decode_upload(data: bytes, max_pixels: int, max_side: int = 1024, budget: MemoryBudget | None = None) -> Image.Image:
    """Decode an uploaded PNG or JPEG to an image at most ``max_side`` on its longer side.

    Images within ``max_side`` are returned as decoded. Larger ones are reduced with a box filter
    (an area average); the mode is kept (16-bit stays 16-bit, palette images are reduced by
    nearest neighbour), so each model path converts exactly as it does for small images.

    Args:
        budget: when given, the decode waits until its :func:`decode_cost` fits in it.

    Raises:
        ServiceError: 422 empty, not an image, corrupt/truncated, or too many pixels;
            415 an image in another format.
    """
    image = _open(data, max_pixels)
    target = _target_size(image.size, max_side)
    if image.format == "JPEG" and target != image.size:
        # libjpeg decodes at 1/2, 1/4 or 1/8 scale directly, never below the requested size.
        image.draft(image.mode, target)
    reservation = budget.reserve(decode_cost(image, max_side)) if budget is not None else nullcontext()
    with reservation:
        try:
            image.load()
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError) as exc:
            raise ServiceError(422, f"the uploaded image is corrupt or truncated ({exc})") from None
        if image.size == target:
            return image
        # reducing_gap=None: Pillow's fast reduce() step does not support 16-bit modes.
        reduced = image.resize(target, Image.Resampling.BOX, reducing_gap=None)
        image.close()
        return reduced

