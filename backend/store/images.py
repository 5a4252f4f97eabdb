"""Gallery image files as HTTP bodies: the original file, or a PNG thumbnail (cached).

Both are served only after the file's bytes were checked to decode: a PNG's chunk checksums
(every chunk, pixel data included) must match, and a JPEG must decode to its end (at 1/8 scale,
which reads every block). A file damaged on disk answers 404 instead of broken bytes; one that
decodes but is not the recorded picture (:mod:`aoq_serve.store.pictures`) raises
:class:`PictureMismatch`.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from aoq_serve.errors import ServiceError
from aoq_serve.store.pictures import digest_of

MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
_DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def check_decodes(data: bytes, max_pixels: int) -> None:
    """Raise unless ``data`` is a whole, undamaged image of at most ``max_pixels`` pixels.

    Raises:
        OSError, ValueError, SyntaxError, EOFError, PIL errors: what Pillow found wrong.
    """
    with Image.open(io.BytesIO(data)) as image:
        if image.width * image.height > max_pixels:
            raise ValueError(f"{image.width}x{image.height} pixels exceed the limit of {max_pixels}")
        if image.format == "PNG":
            image.verify()  # the CRC of every chunk, without decompressing
            return
        if image.format == "JPEG":
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise ServiceError(404, "the image file is missing from the data directory") from None
    except OSError as exc:
        raise ServiceError(404, f"the image file cannot be read ({exc.strerror})") from None


class PictureMismatch(Exception):
    """The file decodes but is not the picture ``aoq index`` recorded (another file in its place)."""


def checked_file(path: Path, max_pixels: int, digest: bytes | None) -> bytes:
    """The file's bytes, once they are checked to decode and, when ``digest`` is given, to be
    the bytes ``aoq index`` recorded (the hash of bytes already read: cheap).

    Raises:
        ServiceError: 404 when the file is missing or cannot be decoded.
        PictureMismatch: the file decodes but its digest differs.
    """
    data = _read(path)
    try:
        check_decodes(data, max_pixels)
    except _DECODE_ERRORS as exc:
        raise ServiceError(404, f"the image file cannot be decoded ({exc})") from None
    if digest is not None and digest_of(data) != digest:
        raise PictureMismatch(f"{path} differs from the picture file that aoq index recorded (sha256 "
                              f"{digest_of(data).hex()[:12]}, recorded {digest.hex()[:12]}); restore it or re-run "
                              f"aoq index")
    return data


@lru_cache(maxsize=2048)
def _thumbnail(path: str, stamp: tuple[int, ...], size: int, max_pixels: int, digest: bytes | None) -> bytes:
    # Keyed by the file's stamp (its change time moves on every write or rename): a replaced file
    # is read, checked and hashed again; exceptions are not cached.
    data = checked_file(Path(path), max_pixels, digest)
    with Image.open(io.BytesIO(data)) as image:
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB").save(out, format="PNG")
    return out.getvalue()


def thumbnail_png(path: Path, size: int, max_pixels: int, digest: bytes | None) -> bytes:
    """A PNG at most ``size`` pixels on its longer side (aspect ratio kept).

    Raises:
        ServiceError: 404 when the file is missing or cannot be decoded.
        PictureMismatch: the file's digest differs from ``digest``.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ServiceError(404, "the image file is missing from the data directory") from None
    try:
        return _thumbnail(str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), size,
                          max_pixels, digest)
    except _DECODE_ERRORS as exc:
        raise ServiceError(404, f"the image file cannot be decoded ({exc})") from None


def media_type(path: Path) -> str:
    return MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")
