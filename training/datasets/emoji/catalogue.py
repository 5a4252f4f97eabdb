"""The emoji list with its words: names, CLDR keywords, groups and base emoji.

- **Which emoji**: every ``fully-qualified`` entry of Unicode's ``emoji-test.txt`` (the RGI set;
  components such as a lone skin-tone swatch are left out), in file order, with the file's
  ``group`` and ``subgroup``.
- **Words**: the CLDR English short name (``type="tts"``) and keyword list from
  ``annotations/en.xml`` and ``annotationsDerived/en.xml`` (skin-tone and gender sequences);
  emoji newer than the CLDR release fall back to the name ``emoji-test.txt`` gives. Character
  names come from ``UnicodeData.txt`` of the same Unicode release as the emoji list (Python's
  ``unicodedata`` may be older and lacks the newest emoji).
- **Base emoji**: variants are joined (union-find) when either key matches:

  1. the *code point key*: the sequence without variation selectors, skin-tone modifiers
     (U+1F3FB..1F3FF), hair components (U+1F9B0..1F9B3) and gender signs (U+2640, U+2642) inside
     a ZWJ sequence, with MAN and WOMAN (U+1F468, U+1F469) read as PERSON (U+1F9D1);
  2. the *name key*: the short name without a ``: ...`` suffix made only of skin tones, hair
     components and person words (``family: man, woman, boy`` -> ``family``), then without
     leading gender words (``woman dancing`` and ``man dancing`` -> ``dancing``; ``man``,
     ``woman``, ``person`` -> ``person``).

  The base id is the lower-case hex sequence of the group's first emoji in file order.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from aoq.data.dataset import DataError

_LINE = re.compile(r"^([0-9A-F ]+?)\s*;\s*([a-z-]+)\s*#\s*\S+\s+E\d+\.\d+\s+(.+)$")
_VS = {0xFE0E, 0xFE0F}
_ZWJ = 0x200D
_SKIN_TONES = set(range(0x1F3FB, 0x1F400))
_HAIR = set(range(0x1F9B0, 0x1F9B4))
_GENDER_SIGNS = {0x2640, 0x2642}
_MAN, _WOMAN, _PERSON = 0x1F468, 0x1F469, 0x1F9D1
#: words that name who an emoji shows; a name suffix made only of these is a variant qualifier.
_PERSON_WORDS = frozenset({"man", "woman", "person", "boy", "girl", "child", "baby"})
#: leading words dropped from a name key (with an "and" joining two of them).
_GENDER_WORDS = frozenset({"man", "woman", "person", "men", "women", "people"})
#: code points whose names are left out of the Unicode-name caption (joiners, selectors, tags).
_SILENT = {_ZWJ, *_VS, *range(0xE0020, 0xE0080)}


@dataclass(frozen=True)
class Emoji:
    """One fully-qualified emoji with its words."""

    codepoints: tuple[int, ...]
    name: str
    keywords: tuple[str, ...]
    unicode_names: tuple[str, ...]
    group: str
    subgroup: str
    order: int
    base: str = ""
    cldr: bool = True

    @property
    def text(self) -> str:
        """The emoji as a string."""
        return "".join(map(chr, self.codepoints))

    @property
    def id(self) -> str:
        """Lower-case hex code points joined by ``-`` (``1f44d-1f3ff``)."""
        return hex_id(self.codepoints)


@dataclass
class _Annotation:
    name: str | None = None
    keywords: tuple[str, ...] = field(default_factory=tuple)


def hex_id(codepoints: tuple[int, ...]) -> str:
    """``(0x1F44D, 0x1F3FF)`` -> ``"1f44d-1f3ff"``."""
    return "-".join(f"{cp:x}" for cp in codepoints)


def load_catalogue(emoji_test: Path, cldr_files: list[Path], unicode_data: Path) -> list[Emoji]:
    """Every fully-qualified emoji in ``emoji-test.txt`` order, with words and base ids.

    Raises:
        DataError: an unreadable or empty input file (named).
    """
    annotations = read_cldr_annotations(cldr_files)
    names = read_unicode_names(unicode_data)
    entries = []
    for order, (cps, test_name, group, subgroup) in enumerate(read_emoji_test(emoji_test)):
        note = annotations.get(_annotation_key(cps), _Annotation())
        name = note.name or test_name
        keywords = note.keywords or (name,)
        spoken = tuple(names.get(cp, f"u+{cp:04x}").lower() for cp in cps if cp not in _SILENT)
        entries.append(Emoji(cps, name, keywords, spoken, group, subgroup, order, cldr=note.name is not None))
    if not entries:
        raise DataError(f"{emoji_test}: no fully-qualified emoji found")
    return assign_bases(entries)


def read_emoji_test(path: Path) -> list[tuple[tuple[int, ...], str, str, str]]:
    """``(code points, name, group, subgroup)`` of each fully-qualified line of emoji-test.txt."""
    group = subgroup = ""
    out = []
    for line in _read_text(path).splitlines():
        if line.startswith("# group:"):
            group = line.split(":", 1)[1].strip()
        elif line.startswith("# subgroup:"):
            subgroup = line.split(":", 1)[1].strip()
        elif (m := _LINE.match(line)) and m.group(2) == "fully-qualified":
            out.append((tuple(int(h, 16) for h in m.group(1).split()), m.group(3).strip(), group, subgroup))
    return out


def read_cldr_annotations(paths: list[Path]) -> dict[str, _Annotation]:
    """Short name and keywords per emoji (key: the emoji without variation selectors)."""
    out: dict[str, _Annotation] = {}
    for path in paths:
        try:
            root = ET.fromstring(path.read_bytes())
        except ET.ParseError as exc:
            raise DataError(f"{path}: not valid CLDR XML ({exc})") from None
        for node in root.iter("annotation"):
            cp, text = node.get("cp"), (node.text or "").strip()
            if not cp or not text:
                continue
            note = out.setdefault(_strip_vs(cp), _Annotation())
            if node.get("type") == "tts":
                note.name = text
            else:
                note.keywords = tuple(k.strip() for k in text.split("|") if k.strip())
    return out


def read_unicode_names(path: Path) -> dict[int, str]:
    """Character name per code point from UnicodeData.txt (ranges and controls skipped)."""
    names = {}
    for line in _read_text(path).splitlines():
        fields = line.split(";", 2)
        if len(fields) >= 2 and not fields[1].startswith("<"):
            names[int(fields[0], 16)] = fields[1]
    return names


def assign_bases(entries: list[Emoji]) -> list[Emoji]:
    """The entries with ``base`` set by the two keys of the module docstring."""
    parent = list(range(len(entries)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_by_key: dict[tuple[str, object], int] = {}
    for i, entry in enumerate(entries):
        for key in (("cp", codepoint_key(entry.codepoints)), ("name", name_key(entry.name))):
            j = first_by_key.setdefault(key, i)
            a, b = find(i), find(j)
            # The smaller index is the root, so the base is the group's first emoji in file order.
            parent[max(a, b)] = min(a, b)
    return [_with_base(e, entries[find(i)].id) for i, e in enumerate(entries)]


def codepoint_key(cps: tuple[int, ...]) -> tuple[int, ...]:
    """Key 1 of the module docstring."""
    joined = _ZWJ in cps  # a gender sign is a variant marker only inside a ZWJ sequence
    kept = [
        _PERSON if cp in (_MAN, _WOMAN) else cp
        for cp in cps
        if cp not in _VS and cp not in _SKIN_TONES and cp not in _HAIR and not (cp in _GENDER_SIGNS and joined)
    ]
    # Removing a component can leave a joiner at an end or two joiners in a row.
    out: list[int] = []
    for cp in kept:
        if cp == _ZWJ and (not out or out[-1] == _ZWJ):
            continue
        out.append(cp)
    while out and out[-1] == _ZWJ:
        out.pop()
    return tuple(out) or tuple(cps)


def name_key(name: str) -> str:
    """Key 2 of the module docstring."""
    head, sep, tail = name.partition(": ")
    if sep and all(_is_qualifier(part) for part in tail.split(", ")):
        name = head
    words = name.split(" ")
    dropped = False
    while words and (words[0] in _GENDER_WORDS or (dropped and words[0] == "and")):
        words.pop(0)
        dropped = True
    return " ".join(words) or "person"


def _is_qualifier(part: str) -> bool:
    return part.endswith("skin tone") or part.endswith(" hair") or part == "bald" or part in _PERSON_WORDS


def _annotation_key(cps: tuple[int, ...]) -> str:
    return "".join(chr(cp) for cp in cps if cp not in _VS)


def _strip_vs(text: str) -> str:
    return "".join(ch for ch in text if ord(ch) not in _VS)


def _with_base(entry: Emoji, base: str) -> Emoji:
    return Emoji(**{**entry.__dict__, "base": base})


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
