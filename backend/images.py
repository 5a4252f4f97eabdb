"""Gallery image files as HTTP bodies: the original file, or a PNG thumbnail (cached)."""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from backend.errors import ServiceError

MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


@lru_cache(maxsize=2048)
def _thumbnail(path: str, mtime_ns: int, size: int, max_pixels: int) -> bytes:
    with Image.open(path) as image:
        if image.width * image.height > max_pixels:
            raise ValueError(f"{image.width}x{image.height} pixels exceed the limit of {max_pixels}")
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB").save(out, format="PNG")
    return out.getvalue()


def thumbnail_png(path: Path, size: int, max_pixels: int) -> bytes:
    """A PNG at most ``size`` pixels on its longer side (aspect ratio kept).

    Raises:
        ServiceError: 404 when the file is missing or cannot be decoded.
    """
    try:
        return _thumbnail(str(path), path.stat().st_mtime_ns, size, max_pixels)
    except FileNotFoundError:
        raise ServiceError(404, "the image file is missing from the data directory") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ServiceError(404, f"the image file cannot be decoded ({exc})") from None


def media_type(path: Path) -> str:
    return MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")
