"""The emoji dataset builder (`aoq data emoji`): sources, words, base emoji, drops, splits, layout.

Built on a small subset (``limit``) of the real packaged sources, which scripts/data-deps.sh
installs; the tests skip, naming that script, only when the sources are absent.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from aoq_cli.main import main
from aoq.data.dataset import DataError
from aoq.data.karpathy import read_karpathy
from aoq.data.precomp import read_precomp
from aoq.features import FEATURE_DIM, N_REGIONS
from aoq.io import file_hashes
from aoq_train.datasets.emoji import build_emoji_dataset
from aoq_train.datasets.emoji.builder import (
    drop_shared_artwork,
    render_all,
    select_emoji,
)
from aoq_train.datasets.emoji.captions import emoji_captions
from aoq_train.datasets.emoji.catalogue import (
    Emoji,
    codepoint_key,
    load_catalogue,
    name_key,
)
from aoq_train.datasets.emoji.sources import locate_sources

LIMIT = 40

try:
    SOURCES = locate_sources()
except DataError as exc:  # pragma: no cover - the set-up installs the sources
    pytest.skip(f"emoji sources not installed (run scripts/data-deps.sh): {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def catalogue() -> list[Emoji]:
    return load_catalogue(SOURCES.emoji_test, [SOURCES.cldr_annotations, SOURCES.cldr_derived], SOURCES.unicode_data)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("emoji") / "data"
    return out, build_emoji_dataset(out, limit=LIMIT, seed=1, sources=SOURCES, progress=False)


def _entries(out: Path) -> list[dict]:
    return json.loads((out / "dataset_emoji.json").read_text(encoding="utf-8"))["images"]


def _by_name(catalogue: list[Emoji]) -> dict[str, Emoji]:
    return {e.name: e for e in catalogue}


def test_catalogue_words_and_bases(catalogue):
    emoji = _by_name(catalogue)
    dark = emoji["thumbs up: dark skin tone"]
    assert dark.codepoints == (0x1F44D, 0x1F3FF)
    assert "dark skin tone" in dark.keywords and dark.group == "People & Body"
    assert dark.unicode_names == ("thumbs up sign", "emoji modifier fitzpatrick type-6")
    # variants share a base, the base is the first of them in emoji-test.txt order
    assert dark.base == emoji["thumbs up"].base == "1f44d"
    assert emoji["woman dancing"].base == emoji["man dancing: dark skin tone"].base
    assert emoji["woman: red hair"].base == emoji["person"].base == emoji["man"].base
    assert emoji["family: man, woman, boy"].base == emoji["family"].base
    # different emoji that only share a name prefix stay apart
    assert emoji["keycap: #"].base != emoji["keycap: *"].base
    assert emoji["flag: Germany"].base != emoji["flag: France"].base
    assert emoji["keycap: #"].unicode_names == ("number sign", "combining enclosing keycap")


def test_keys():
    assert codepoint_key((0x1F469, 0x1F3FD, 0x200D, 0x2695, 0xFE0F)) == (0x1F9D1, 0x200D, 0x2695)
    assert codepoint_key((0x1F9D4, 0x200D, 0x2642, 0xFE0F)) == (0x1F9D4,)
    assert codepoint_key((0x2640, 0xFE0F)) == (0x2640,)  # the female sign on its own is kept
    assert name_key("kiss: woman, man") == "kiss"
    assert name_key("woman and man holding hands") == "holding hands"
    assert name_key("woman") == "person"
    assert name_key("flag: Germany") == "flag: Germany"
    assert name_key("man’s shoe") == "man’s shoe"


def test_caption_rule_is_exact():
    item = Emoji((0x1F44D, 0x1F3FF), "thumbs up: dark skin tone", ("+1", "dark skin tone", "hand"),
                 ("thumbs up sign", "emoji modifier fitzpatrick type-6"), "People & Body", "hand-fingers-closed", 0)
    assert emoji_captions(item) == [
        "thumbs up: dark skin tone",
        "thumbs up sign, emoji modifier fitzpatrick type-6",
        "+1, dark skin tone, hand",
        "thumbs up: dark skin tone, hand fingers closed",
        "people & body: thumbs up: dark skin tone",
    ]


def test_limit_keeps_whole_bases(catalogue):
    chosen = select_emoji(catalogue, LIMIT, seed=1)
    assert 0 < len(chosen) <= LIMIT
    members = defaultdict(int)
    for e in catalogue:
        members[e.base] += 1
    for base in {e.base for e in chosen}:
        assert sum(e.base == base for e in chosen) == members[base]


def test_limit_keeps_the_included_names_first(catalogue):
    chosen = select_emoji(catalogue, LIMIT, seed=1, include=("flag: Japan",))
    assert "flag: Japan" in [e.name for e in chosen] and len(chosen) <= LIMIT
    assert chosen == select_emoji(catalogue, LIMIT, seed=1, include=("flag: Japan",))  # deterministic
    assert "flag: Japan" not in [e.name for e in select_emoji(catalogue, LIMIT, seed=1)]
    with pytest.raises(ValueError, match="no emoji is called 'flag: Atlantis'"):
        select_emoji(catalogue, LIMIT, seed=1, include=("flag: Atlantis",))


def test_layout_five_captions_labels_and_readers(built):
    out, manifest = built
    entries = _entries(out)
    stats = manifest["stats"]
    assert len(entries) == sum(stats["images"].values()) == sum(s["images"] for s in stats["splits"].values())
    for entry in entries:
        assert len(entry["sentences"]) == 5 and len(entry["sentids"]) == 5
        assert entry["vendor"] in ("noto", "twemoji")
        assert entry["labels"][0].startswith("group:") and entry["labels"][1].startswith("subgroup:")
        assert entry["filename"] == f"{entry['vendor']}_{entry['emoji_id']}.png"
    desc = read_karpathy(out / "dataset_emoji.json")
    for split, karpathy_split in (("train", "train"), ("dev", "val"), ("test", "test")):
        rows = [e for e in entries if e["split"] == karpathy_split]
        if not rows:
            continue
        precomp = read_precomp(out / "precomp", split, captions_per_image=5)
        assert precomp.n_images == len(rows) == desc.splits[split].n_images
        assert precomp.features.shape == (len(rows), N_REGIONS, FEATURE_DIM)
        assert precomp.captions == desc.splits[split].captions == [s["raw"] for e in rows for s in e["sentences"]]
    assert sorted(p.name for p in (out / "LICENSES").iterdir()) == [
        "noto-color-emoji.copyright.txt", "twemoji-graphics.ATTRIBUTION.txt", "twemoji-svg-package.LICENSE.txt",
        "unicode-cldr-core.copyright.txt", "unicode-data.copyright.txt",
    ]
    assert "CC-BY 4.0" in (out / "LICENSES" / "twemoji-graphics.ATTRIBUTION.txt").read_text()
    assert "SIL Open Font License" in (out / "LICENSES" / "noto-color-emoji.copyright.txt").read_text()


def test_split_by_base_keeps_variants_and_vendors_together(built):
    out, _ = built
    splits = defaultdict(set)
    sizes = defaultdict(int)
    for entry in _entries(out):
        splits[entry["base"]].add(entry["split"])
        sizes[entry["base"]] += 1
    assert max(sizes.values()) > 2  # the subset has a base with variants, so the check means something
    assert all(len(s) == 1 for s in splits.values())


def test_split_by_image_separates_some_variants(tmp_path):
    out = tmp_path / "by_image"
    build_emoji_dataset(out, split_by="image", limit=LIMIT, seed=1, sources=SOURCES, progress=False)
    splits = defaultdict(set)
    for entry in _entries(out):
        splits[entry["base"]].add(entry["split"])
    assert any(len(s) > 1 for s in splits.values())


def test_same_inputs_give_byte_identical_output(built, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    assert main(["data", "emoji", "--out", str(again), "--limit", str(LIMIT), "--seed", "1", "--no-progress"]) == 0
    assert file_hashes(again) == file_hashes(out)
    assert (again / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    other = tmp_path / "other"
    build_emoji_dataset(other, limit=LIMIT, seed=2, sources=SOURCES, progress=False)
    assert file_hashes(other) != file_hashes(out)


def test_rendering_processes_give_the_same_files(built, tmp_path, monkeypatch):
    from aoq_train.datasets.emoji import builder

    out, _ = built
    monkeypatch.setattr(builder, "RENDER_CHUNK", 8)  # several chunks over two processes, back in order
    monkeypatch.setattr(builder, "RENDER_POOL_MIN", 0)
    build_emoji_dataset(tmp_path / "pooled", limit=LIMIT, seed=1, sources=SOURCES, progress=False, workers=2)
    assert file_hashes(tmp_path / "pooled") == file_hashes(out)


def _fake_twemoji(root: Path, svgs: dict[str, str]) -> Path:
    root.mkdir()
    (root / "package.json").write_text('{"name": "@twemoji/svg", "version": "0.0.0-test"}')
    (root / "license").write_text("test")
    for stem, body in svgs.items():
        (root / f"{stem}.svg").write_text(body)
    return root


_SQUARE = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 36 36">'
           '<rect x="4" y="4" width="28" height="28" fill="{}"/></svg>')


def test_missing_blank_and_shared_artwork_are_dropped(tmp_path):
    twemoji = _fake_twemoji(tmp_path / "tw", {
        "1f600": _SQUARE.format("#f00"),
        "1f601": _SQUARE.format("#0f0"),  # the same artwork as 1f602
        "1f602": _SQUARE.format("#0f0"),
        "1f603": '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 36 36"/>',  # blank
        "1f605": _SQUARE.format("#00f"),
    })  # no SVG for 1f604 and the last two sequences: missing
    sources = locate_sources(twemoji_dir=twemoji)
    codepoints = [
        (0x1F600,), (0x1F601,), (0x1F602,), (0x1F603,), (0x1F604,), (0x1F605,),
        (0x1F600,),  # a second emoji with the artwork of the first, for both vendors
        (0x1F436, 0x200D, 0x1F355),  # dog ZWJ pizza: no font ligates it, Noto draws two glyphs
        (0x10FFFD,),  # unassigned: Noto draws its .notdef glyph
    ]
    emoji = [Emoji(cps, f"e{i}", ("k",), ("n",), "G", "s", i, base=f"b{i}") for i, cps in enumerate(codepoints)]
    pictures, dropped = render_all(emoji, sources, progress=False)
    assert dropped["noto"] == {"missing": 2}
    assert dropped["twemoji"] == {"missing": 3, "blank": 1}
    kept, shared = drop_shared_artwork(pictures)
    assert shared == {"noto": 2, "twemoji": 4}
    assert sorted(p.key for p in kept) == [
        "noto_1f601", "noto_1f602", "noto_1f603", "noto_1f604", "noto_1f605", "twemoji_1f605",
    ]


@pytest.mark.parametrize(
    ("argument", "package"),
    [
        ("--noto-font={empty}/NotoColorEmoji.ttf", "fonts-noto-color-emoji"),
        ("--cldr-dir={empty}", "unicode-cldr-core"),
        ("--unicode-dir={empty}", "unicode-data"),
        ("--twemoji-dir={empty}", "npm package @twemoji/svg"),
    ],
)
def test_missing_source_is_one_clear_error(tmp_path, capsys, argument, package):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    assert main(["data", "emoji", "--out", str(out), argument.format(empty=empty), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aoq data: error: ") and package in err and str(empty) in err
    assert "scripts/data-deps.sh" in err
    assert not out.exists()


def test_missing_rasteriser_names_the_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "cairosvg", None)  # makes `import cairosvg` raise ImportError
    with pytest.raises(DataError, match="PyPI package cairosvg and the Debian package libcairo2"):
        locate_sources()


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="refusing to replace a folder that is not an emoji dataset"):
        build_emoji_dataset(mine, limit=1, sources=SOURCES, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"
    shutil.rmtree(mine)
