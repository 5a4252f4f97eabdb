"""Both vendors' pictures of an emoji as ``SIZE`` x ``SIZE`` RGB images on white.

The artwork's own box (Noto's 136x128 glyph cell at size 109, Twemoji's 36x36 view box) is
scaled to fit ``ART`` pixels and centred, so relative sizes inside a vendor survive (the small and
large blue diamonds stay different) and a white border of at least ``(SIZE - ART) / 2`` pixels is
left for the region extractor, which reads the background colour from the border.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

#: side of every picture; 128 px keeps the artwork legible and the full set under 100 MB.
SIZE = 128
#: side of the box the artwork is fitted into.
ART = 120
NOTO_POINT_SIZE = 109  # the one bitmap strike of Noto Color Emoji (CBDT); other sizes rescale it
#: a code point no font maps: Noto draws its .notdef glyph for it.
_MISSING_PROBE = "\U0010FFFD"
_REFERENCE = "\U0001F600"
#: a pixel is artwork when some channel is darker than this (on white).
_INK_LEVEL = 245
#: a picture with less artwork than this share of its pixels is blank.
BLANK_SHARE = 0.005


class NotoRenderer:
    """Draws emoji with the Noto Color Emoji font through Pillow (colour bitmaps, HarfBuzz layout)."""

    def __init__(self, font_path: Path) -> None:
        self.font = ImageFont.truetype(str(font_path), NOTO_POINT_SIZE, layout_engine=ImageFont.Layout.RAQM)
        self.advance = self.font.getlength(_REFERENCE)
        left, top, right, bottom = self.font.getbbox(_REFERENCE)
        self.cell = (right - left, bottom - top)
        self.missing = self._draw(_MISSING_PROBE)

    def render(self, text: str) -> Image.Image | None:
        """The picture, or None when the font has no single glyph for ``text``.

        A sequence the font cannot ligate comes out as several glyphs side by side (a longer
        advance); a code point it lacks comes out as its .notdef glyph.
        """
        if abs(self.font.getlength(text) - self.advance) > 0.5:
            return None
        cell = self._draw(text)
        if cell.tobytes() == self.missing.tobytes():
            return None
        return _fit(cell)

    def _draw(self, text: str) -> Image.Image:
        cell = Image.new("RGBA", self.cell, (0, 0, 0, 0))
        ImageDraw.Draw(cell).text((0, 0), text, font=self.font, embedded_color=True)
        return cell


class TwemojiRenderer:
    """Rasterises Twemoji SVG files with cairosvg."""

    def __init__(self, svg_dir: Path) -> None:
        import cairosvg  # imported here: the module loads libcairo

        self._svg2png = cairosvg.svg2png
        self.svg_dir = svg_dir

    def svg_path(self, codepoints: tuple[int, ...]) -> Path | None:
        """The SVG file of a sequence: Twemoji names files by hex code points joined by ``-``,
        without U+FE0F in most names; both spellings are tried."""
        full = "-".join(f"{cp:x}" for cp in codepoints)
        bare = "-".join(f"{cp:x}" for cp in codepoints if cp != 0xFE0F)
        for stem in (bare, full):
            path = self.svg_dir / f"{stem}.svg"
            if path.is_file():
                return path
        return None

    def render(self, codepoints: tuple[int, ...]) -> Image.Image | None:
        """The picture, or None when there is no SVG for the sequence."""
        path = self.svg_path(codepoints)
        if path is None:
            return None
        png = self._svg2png(url=str(path), output_width=ART, output_height=ART)
        art = Image.open(io.BytesIO(png)).convert("RGBA")
        return _on_white(art)


def is_blank(image: Image.Image) -> bool:
    """True when less than ``BLANK_SHARE`` of the pixels carry artwork."""
    pixels = np.asarray(image.convert("RGB"))
    return float((pixels.min(axis=2) < _INK_LEVEL).mean()) < BLANK_SHARE


def _fit(art: Image.Image) -> Image.Image:
    """Scale an RGBA artwork box to fit ``ART`` pixels (aspect kept) and centre it on white."""
    scale = ART / max(art.size)
    size = (max(1, round(art.width * scale)), max(1, round(art.height * scale)))
    return _on_white(art.resize(size, Image.Resampling.LANCZOS))


def _on_white(art: Image.Image) -> Image.Image:
    canvas = Image.new("RGBA", (SIZE, SIZE), (255, 255, 255, 255))
    canvas.alpha_composite(art, ((SIZE - art.width) // 2, (SIZE - art.height) // 2))
    return canvas.convert("RGB")
