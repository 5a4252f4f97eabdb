"""Precomp and Karpathy readers, and load_split, on tiny COCO/Flickr-layout fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aoq.config import DataConfig
from aoq.data.dataset import DataError
from aoq.data.karpathy import read_karpathy
from aoq.data.load import load_split
from aoq.data.precomp import read_precomp
from tests.fixtures import (
    fixture_captions,
    write_karpathy_fixture,
    write_precomp_fixture,
)


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as err:
        fn(*args, **kwargs)
    return str(err.value)


# --------------------------------------------------------------------------- precomp


def test_precomp_region_features(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, regions=4, dim=16)
    split = read_precomp(root, "train")
    assert isinstance(split.features, np.memmap)
    assert not split.features.flags.writeable
    assert split.features.shape == (20, 4, 16)
    np.testing.assert_array_equal(split.features, np.load(root / "train_ims.npy"))
    assert split.captions == fixture_captions("train", 20)
    assert split.captions_per_image == 5 and split.n_captions == 100
    assert split.image_ids[:3] == ["0", "1", "2"] and split.image_ids[-1] == "19"
    assert split.image_paths is None and split.feature_dim == 16
    assert split.captions[7].endswith("in picture 1.")  # caption 7 belongs to image 7 // 5


def test_precomp_global_features(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, splits={"test": 3}, regions=None, dim=8, cpi=2)
    split = read_precomp(root, "test", captions_per_image=2)
    assert isinstance(split.features, np.memmap)
    assert split.features.shape == (3, 8)
    assert split.captions_per_image == 2 and split.n_captions == 6


def test_precomp_max_images_cuts_dev_and_stays_mapped(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    split = read_precomp(root, "dev", max_images=2)
    assert split.n_images == 2 and split.captions == fixture_captions("dev", 5)[:10]
    assert isinstance(split.features, np.memmap) and split.features.shape == (2, 4, 16)


def test_precomp_scan_testall_name(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, splits={"test": 2, "testall": 6})
    assert read_precomp(root, "testall").n_images == 6
    assert read_precomp(root, "test").n_images == 2


def test_precomp_caption_file_details(tmp_path: Path) -> None:
    """UTF-8 text, CRLF line ends, no final newline, a BOM and U+2028 inside a caption."""
    root = write_precomp_fixture(tmp_path, splits={"dev": 1}, cpi=3)
    (root / "dev_caps.txt").write_bytes(
        "\ufeffUn café crème .\r\nA line\u2028separator inside\r\n  padded caption  ".encode("utf-8")
    )
    split = read_precomp(root, "dev")
    assert split.captions == ["Un café crème .", "A line\u2028separator inside", "  padded caption  "]
    assert all(isinstance(c, str) for c in split.captions)


def test_precomp_one_row_per_caption_is_deduplicated(tmp_path: Path) -> None:
    root = tmp_path / "f30k_precomp"
    images = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    root.mkdir()
    np.save(root / "dev_ims.npy", np.repeat(images, 5, axis=0))
    (root / "dev_caps.txt").write_text("".join(f"caption {i}\n" for i in range(15)), encoding="utf-8")
    inferred = read_precomp(root, "dev")
    assert inferred.captions_per_image == 1 and inferred.n_images == 15
    split = read_precomp(root, "dev", captions_per_image=5)
    assert split.captions_per_image == 5 and split.image_ids == ["0", "1", "2"]
    np.testing.assert_array_equal(split.features, images)
    assert isinstance(split.features, np.memmap)


def test_precomp_one_row_per_caption_with_distinct_rows_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    np.save(root / "dev_ims.npy", np.arange(10 * 4, dtype=np.float32).reshape(10, 4))
    (root / "dev_caps.txt").write_text("".join(f"caption {i}\n" for i in range(10)), encoding="utf-8")
    message = _error(read_precomp, root, "dev", captions_per_image=5)
    assert message.startswith(f"{root / 'dev_ims.npy'}: one feature row per caption, but rows 0..4 differ")
    assert "data.captions_per_image=1" in message


def test_precomp_missing_folder(tmp_path: Path) -> None:
    assert _error(read_precomp, tmp_path / "nope", "train") == f"{tmp_path / 'nope'}: precomp folder not found"


def test_precomp_unknown_split_lists_available(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, splits={"train": 2, "dev": 1, "testall": 1})
    assert _error(read_precomp, root, "val") == f"{root}: unknown split 'val'; available: dev, testall, train"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "available: none (no *_ims.npy files)" in _error(read_precomp, empty, "train")


@pytest.mark.parametrize("missing", ["train_ims.npy", "train_caps.txt"])
def test_precomp_missing_file(tmp_path: Path, missing: str) -> None:
    root = write_precomp_fixture(tmp_path)
    (root / missing).unlink()
    message = _error(read_precomp, root, "train")
    assert message == f"{root / missing}: missing (split 'train' needs train_ims.npy and train_caps.txt)"


def test_precomp_caption_count_not_a_multiple(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    caps = root / "dev_caps.txt"
    caps.write_text("".join(caps.read_text(encoding="utf-8").splitlines(keepends=True)[:-2]), encoding="utf-8")
    assert _error(read_precomp, root, "dev") == (
        f"{caps}: 23 captions is not a multiple of the 5 images in dev_ims.npy"
    )


def test_precomp_captions_per_image_mismatch(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, cpi=5)
    message = _error(read_precomp, root, "dev", captions_per_image=2)
    assert message == f"{root / 'dev_caps.txt'}: 25 captions for 5 images is 5 per image, expected 2"


@pytest.mark.parametrize("blank", ["", "   \t"])
def test_precomp_empty_caption_names_the_line(tmp_path: Path, blank: str) -> None:
    root = write_precomp_fixture(tmp_path)
    caps = root / "dev_caps.txt"
    lines = caps.read_text(encoding="utf-8").splitlines()
    lines[2] = blank
    caps.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _error(read_precomp, root, "dev") == f"{caps}: line 3 is an empty caption"


def test_precomp_empty_caption_file(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    (root / "dev_caps.txt").write_bytes(b"")
    assert _error(read_precomp, root, "dev") == f"{root / 'dev_caps.txt'}: no captions (empty file)"


def test_precomp_non_utf8_captions(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    (root / "dev_caps.txt").write_bytes(b"a dog\na caf\xe9\n")
    assert _error(read_precomp, root, "dev").startswith(f"{root / 'dev_caps.txt'}: line 2 is not UTF-8 text")


@pytest.mark.parametrize("shape", [(5,), (5, 2, 3, 4)])
def test_precomp_wrong_array_shape(tmp_path: Path, shape: tuple[int, ...]) -> None:
    root = write_precomp_fixture(tmp_path)
    np.save(root / "dev_ims.npy", np.zeros(shape, dtype=np.float32))
    assert _error(read_precomp, root, "dev") == (
        f"{root / 'dev_ims.npy'}: features must be (N, R, D) region or (N, D) global features, "
        f"got shape {shape} (ndim {len(shape)})"
    )


def test_precomp_unreadable_or_truncated_array(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    ims = root / "dev_ims.npy"
    ims.write_bytes(ims.read_bytes()[:200])
    assert _error(read_precomp, root, "dev").startswith(f"{ims}: not a readable .npy array (")
    ims.write_bytes(b"definitely not numpy")
    assert _error(read_precomp, root, "dev").startswith(f"{ims}: not a readable .npy array (")


def test_precomp_non_numeric_and_empty_arrays(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path)
    np.save(root / "dev_ims.npy", np.array([["a", "b"]] * 5))
    assert _error(read_precomp, root, "dev") == f"{root / 'dev_ims.npy'}: features must be numeric, got dtype <U1"
    np.save(root / "dev_ims.npy", np.zeros((0, 4), dtype=np.float32))
    assert _error(read_precomp, root, "dev") == f"{root / 'dev_ims.npy'}: no images (shape (0, 4))"


# --------------------------------------------------------------------------- Karpathy


def _expected(json_path: Path, labels: set[str], cpi: int = 5) -> tuple[list[str], list[str]]:
    """(image ids, captions) the reader should return for the entries with these labels."""
    entries = [e for e in json.loads(json_path.read_text(encoding="utf-8"))["images"] if e["split"] in labels]
    ids = [str(e.get("cocoid", e["imgid"])) for e in entries]
    return ids, [s["raw"] for e in entries for s in e["sentences"][:cpi]]


def test_karpathy_coco_layout(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="coco")
    data = read_karpathy(path)
    assert data.name == "coco" and data.format == "karpathy" and data.root == tmp_path
    assert sorted(data.splits) == ["dev", "test", "train"]
    train = data.split("train")
    assert train.n_images == 8 and train.n_captions == 40  # 6 train + 2 restval
    assert (train.image_ids, train.captions) == _expected(path, {"train", "restval"})
    assert (data.split("dev").image_ids, data.split("dev").captions) == _expected(path, {"val"})
    assert (data.split("test").image_ids, data.split("test").captions) == _expected(path, {"test"})
    assert train.features is None and all(p.is_file() for p in train.image_paths)
    entry = json.loads(path.read_text(encoding="utf-8"))["images"][0]
    k = train.image_ids.index(str(entry["cocoid"]))
    assert train.image_paths[k] == tmp_path / entry["filepath"] / entry["filename"]


def test_karpathy_keeps_first_five_of_seven_sentences(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="coco", extra_sentences=2)
    long = fixture_captions("val", 3, cpi=7)[:7]  # image 0 of "val" has 7 sentences
    dev = read_karpathy(path).split("dev")
    assert dev.n_captions == 15
    assert set(long[:5]) <= set(dev.captions) and not set(long[5:]) & set(dev.captions)


def test_karpathy_flickr30k_layout(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="flickr30k")
    data = read_karpathy(path)
    assert data.name == "flickr30k"
    assert {n: s.n_images for n, s in data.splits.items()} == {"train": 6, "dev": 3, "test": 3}
    test = data.split("test")
    assert (test.image_ids, test.captions) == _expected(path, {"test"})
    entries = {str(e["imgid"]): e["filename"] for e in json.loads(path.read_text(encoding="utf-8"))["images"]}
    assert test.image_paths == [tmp_path / entries[i] for i in test.image_ids]


def test_karpathy_flickr8k_layout_with_image_root(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="flickr8k", image_subdir="Flicker8k_Dataset")
    data = read_karpathy(path, image_root=tmp_path / "Flicker8k_Dataset")
    assert data.root == tmp_path / "Flicker8k_Dataset"
    assert all(p.parent == data.root and p.is_file() for p in data.split("train").image_paths)


def test_karpathy_missing_images_listed(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="flickr30k", image_subdir="flickr30k-images")
    message = _error(read_karpathy, path)
    assert message.startswith(f"{tmp_path}: 12 of 12 images missing: {tmp_path}/")
    assert message.count(".png") == 5 and " and 7 more (is the image folder right?" in message
    unchecked = read_karpathy(path, check_files=False)
    assert unchecked.split("train").n_images == 6


def test_karpathy_whitespace_and_tokens_only_sentences(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    sentences = [{"raw": " A dog\non a  bed \n"}, {"tokens": ["a", "cat"]}]
    path.write_text(json.dumps({"images": [{"filename": "x.png", "split": "test", "sentences": sentences}]}))
    data = read_karpathy(path, captions_per_image=2, check_files=False)
    assert data.name == "d" and data.split("test").captions == ["A dog on a bed", "a cat"]
    assert data.split("test").image_ids == ["x.png"]


def _write_json(tmp_path: Path, images: object) -> Path:
    path = tmp_path / "dataset_x.json"
    path.write_text(json.dumps({"images": images}), encoding="utf-8")
    return path


def _entry(**changes: object) -> dict:
    entry = {"filename": "a.png", "imgid": 0, "split": "train", "sentences": [{"raw": f"cap {i}"} for i in range(5)]}
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ([_entry(), 7], "images[1]: an image entry must be an object, got int"),
        ([{"filename": "a.png"}], "images[0]: missing key(s) 'split', 'sentences'"),
        ([_entry(split="validation")],
         "images[0] (a.png): unknown split 'validation'; expected one of train, restval, val, test"),
        ([_entry(sentences=[{"raw": "x"}] * 4)], "images[0] (a.png): has 4 sentences, 5 captions per image are needed"),
        ([_entry(sentences="a dog")], "images[0] (a.png): has no sentences, 5 captions per image are needed"),
        ([_entry(sentences=[{"raw": "x"}] * 2 + [{"raw": "  "}] + [{"raw": "y"}] * 2)],
         "images[0] (a.png): sentence 2: empty caption"),
        ([_entry(sentences=[{"raw": "x"}] * 4 + [{"text": "y"}])],
         'images[0] (a.png): sentence 4: needs a "raw" string or a "tokens" list'),
        ([], "no images"),
    ],
)
def test_karpathy_bad_entries(tmp_path: Path, images: object, message: str) -> None:
    path = _write_json(tmp_path, images)
    assert _error(read_karpathy, path, check_files=False) == f"{path}: {message}"


def test_karpathy_unreadable_json(tmp_path: Path) -> None:
    path = tmp_path / "dataset_coco.json"
    assert _error(read_karpathy, path) == f"{path}: Karpathy split JSON not found"
    path.write_text('{"images": [', encoding="utf-8")
    assert _error(read_karpathy, path).startswith(f"{path}: not valid JSON (")
    path.write_text('{"dataset": "coco"}', encoding="utf-8")
    assert _error(read_karpathy, path) == f'{path}: missing key "images" (the list of image entries)'


def test_karpathy_unknown_split_lists_available(tmp_path: Path) -> None:
    data = read_karpathy(write_karpathy_fixture(tmp_path, kind="coco"))
    assert _error(data.split, "restval") == f"{tmp_path}: unknown split 'restval'; available: dev, test, train"


# --------------------------------------------------------------------------- load_split


def test_load_split_precomp(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, splits={"train": 4, "dev": 5, "test": 2, "testall": 6})
    cfg = DataConfig(format="precomp", path=str(root), max_dev_images=3)
    assert load_split(cfg, "train").n_images == 4
    dev = load_split(cfg, "dev")
    assert dev.n_images == 3 and dev.name == "dev" and isinstance(dev.features, np.memmap)
    assert load_split(cfg, "test").n_images == 2
    cfg5k = DataConfig(format="precomp", path=str(root), test_split="testall")
    assert load_split(cfg5k, "test").n_images == 6
    assert load_split(cfg5k, "dev").n_images == 5  # no cut configured


def test_load_split_precomp_checks_captions_per_image(tmp_path: Path) -> None:
    root = write_precomp_fixture(tmp_path, cpi=5)
    message = _error(load_split, DataConfig(format="precomp", path=str(root), captions_per_image=4), "test")
    assert message == f"{root / 'test_caps.txt'}: 25 captions for 5 images is 5 per image, expected 4"


def test_load_split_karpathy(tmp_path: Path) -> None:
    path = write_karpathy_fixture(tmp_path, kind="flickr30k", image_subdir="images")
    cfg = DataConfig(format="karpathy", path=str(path), image_root=str(tmp_path / "images"), max_dev_images=2)
    assert load_split(cfg, "train").n_images == 6
    assert load_split(cfg, "dev").n_images == 2
    assert load_split(cfg.model_copy(update={"dev_split": "val"}), "dev").n_images == 2  # Karpathy's label
    assert load_split(cfg, "test").image_paths[0].parent == tmp_path / "images"
    message = _error(load_split, cfg.model_copy(update={"test_split": "testall"}), "test")
    assert message == f"{tmp_path / 'images'}: unknown split 'testall'; available: dev, test, train"


# --------------------------------------------------------------------------- synthetic set


def test_both_readers_agree_on_the_synthetic_set(tmp_path: Path) -> None:
    from aoq_cli.main import main as aoq

    out = tmp_path / "synth"
    args = ["synth", "--out", str(out), "--train", "8", "--dev", "4", "--test", "4", "--workers", "1", "--no-progress"]
    assert aoq(args) == 0
    karpathy = read_karpathy(out / "dataset_synth.json")
    assert {n: s.n_images for n, s in karpathy.splits.items()} == {"train": 8, "dev": 4, "test": 4}
    for name in ("train", "dev", "test"):  # Karpathy "val" is read as "dev", the precomp name
        from_json, from_precomp = karpathy.split(name), read_precomp(out / "precomp", name, captions_per_image=5)
        assert from_precomp.n_images == from_json.n_images
        assert from_precomp.captions == from_json.captions
        assert isinstance(from_precomp.features, np.memmap) and from_precomp.features.ndim == 3
        assert all(p.is_file() for p in from_json.image_paths)
    cfg = DataConfig(format="karpathy", path=str(out / "dataset_synth.json"), dev_split="val")
    assert load_split(cfg, "dev").captions == load_split(DataConfig(path=str(out / "precomp")), "dev").captions
