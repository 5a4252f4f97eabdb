"""Where the packaged inputs of the emoji dataset live, and a clear error when one is missing.

Every input comes from a package (nothing is downloaded at build time):

========================  ==================================  ====================================
input                     package                             default location
========================  ==================================  ====================================
Noto Color Emoji font     Debian ``fonts-noto-color-emoji``   /usr/share/fonts/truetype/noto
CLDR annotations (en)     Debian ``unicode-cldr-core``        /usr/share/unicode/cldr/common
emoji-test.txt, names     Debian ``unicode-data``             /usr/share/unicode
Twemoji SVGs              npm ``@twemoji/svg``                .cache/twemoji (``npm --prefix``)
SVG rasteriser            PyPI ``cairosvg`` + Debian libcairo2
========================  ==================================  ====================================

``scripts/data-deps.sh`` installs all of them. Each location can be overridden by an argument or
an environment variable (``AOQ_NOTO_FONT``, ``AOQ_CLDR_DIR``, ``AOQ_UNICODE_DIR``,
``AOQ_TWEMOJI_DIR``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from aoq.data.dataset import DataError
from aoq.io import sha256_file

DEFAULT_NOTO_FONT = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
DEFAULT_CLDR_DIR = Path("/usr/share/unicode/cldr/common")
DEFAULT_UNICODE_DIR = Path("/usr/share/unicode")
#: the ``npm install --prefix`` folder, relative to the working directory or the repository.
DEFAULT_TWEMOJI_PREFIX = Path(".cache/twemoji")
_TWEMOJI_PACKAGE = Path("node_modules/@twemoji/svg")
_REPO_ROOT = Path(__file__).resolve().parents[3]
_INSTALL_HINT = "run scripts/data-deps.sh, which installs every source of the emoji dataset"


@dataclass(frozen=True)
class EmojiSources:
    """Paths of the checked inputs (see :func:`locate_sources`)."""

    noto_font: Path
    cldr_annotations: Path
    cldr_derived: Path
    emoji_test: Path
    unicode_data: Path
    twemoji_svg_dir: Path
    twemoji_version: str
    licence_files: dict[str, Path]

    def fingerprint(self) -> dict[str, str]:
        """SHA-256 of every input file and the Twemoji version: the provenance of a build."""
        files = {
            "noto_font": self.noto_font,
            "cldr_annotations": self.cldr_annotations,
            "cldr_annotations_derived": self.cldr_derived,
            "emoji_test": self.emoji_test,
            "unicode_data": self.unicode_data,
        }
        out = {name: sha256_file(path) for name, path in files.items()}
        out["twemoji_svg"] = self.twemoji_version
        return out


def locate_sources(
    noto_font: str | Path | None = None,
    cldr_dir: str | Path | None = None,
    unicode_dir: str | Path | None = None,
    twemoji_dir: str | Path | None = None,
) -> EmojiSources:
    """Find and check every input; arguments override the environment, which overrides defaults.

    Args:
        noto_font: the NotoColorEmoji.ttf file.
        cldr_dir: CLDR's ``common`` folder (holding ``annotations/`` and ``annotationsDerived/``).
        unicode_dir: the folder holding ``UnicodeData.txt`` and ``emoji/emoji-test.txt``.
        twemoji_dir: the ``npm install --prefix`` folder of ``@twemoji/svg``, or the package
            folder itself (the one holding the ``*.svg`` files).

    Raises:
        DataError: naming the missing file and the package that provides it.
    """
    font = Path(noto_font or os.environ.get("AOQ_NOTO_FONT") or DEFAULT_NOTO_FONT)
    cldr = Path(cldr_dir or os.environ.get("AOQ_CLDR_DIR") or DEFAULT_CLDR_DIR)
    uni = Path(unicode_dir or os.environ.get("AOQ_UNICODE_DIR") or DEFAULT_UNICODE_DIR)
    twemoji = _twemoji_package(twemoji_dir or os.environ.get("AOQ_TWEMOJI_DIR"))

    _need(font, "the Noto Color Emoji font", "Debian package fonts-noto-color-emoji")
    annotations = _need(cldr / "annotations" / "en.xml", "CLDR English annotations", "Debian package unicode-cldr-core")
    derived = _need(
        cldr / "annotationsDerived" / "en.xml", "CLDR derived English annotations", "Debian package unicode-cldr-core"
    )
    emoji_test = _need(uni / "emoji" / "emoji-test.txt", "the Unicode emoji list", "Debian package unicode-data")
    unicode_data = _need(uni / "UnicodeData.txt", "the Unicode character names", "Debian package unicode-data")
    package_json = _need(twemoji / "package.json", "the Twemoji SVG artwork", "npm package @twemoji/svg")
    try:
        version = str(json.loads(package_json.read_text(encoding="utf-8"))["version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{package_json}: unreadable package.json of @twemoji/svg ({exc}); {_INSTALL_HINT}") from None
    check_rasteriser()
    licences = {
        "noto-color-emoji.copyright.txt": Path("/usr/share/doc/fonts-noto-color-emoji/copyright"),
        "unicode-cldr-core.copyright.txt": Path("/usr/share/doc/unicode-cldr-core/copyright"),
        "unicode-data.copyright.txt": Path("/usr/share/doc/unicode-data/copyright"),
        "twemoji-svg-package.LICENSE.txt": twemoji / "license",
    }
    for path in licences.values():
        if not path.is_file():
            raise DataError(f"{path}: licence file missing (shipped with the package it names); {_INSTALL_HINT}")
    return EmojiSources(font, annotations, derived, emoji_test, unicode_data, twemoji, version, licences)


def check_rasteriser() -> None:
    """Raise :class:`DataError` unless cairosvg and the cairo library it loads are importable."""
    try:
        import cairosvg  # noqa: F401  (imported for the check only)
    except ImportError as exc:
        raise DataError(
            f"cannot import cairosvg ({exc}); install the PyPI package cairosvg and the Debian "
            f"package libcairo2 ({_INSTALL_HINT})"
        ) from None
    except OSError as exc:  # the wheel is there but libcairo is not
        raise DataError(f"cairosvg cannot load cairo ({exc}); install the Debian package libcairo2") from None


def _twemoji_package(given: str | Path | None) -> Path:
    """The folder holding the SVG files, from a prefix or package folder, else the defaults."""
    candidates = [Path(given)] if given else [Path.cwd() / DEFAULT_TWEMOJI_PREFIX, _REPO_ROOT / DEFAULT_TWEMOJI_PREFIX]
    for base in candidates:
        for folder in (base / _TWEMOJI_PACKAGE, base):
            if (folder / "package.json").is_file():
                return folder
    return candidates[0] / _TWEMOJI_PACKAGE


def _need(path: Path, what: str, package: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: {what} not found; install the {package} ({_INSTALL_HINT})")
    return path

