"""torch datasets and collates over precomp features and Karpathy image folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from aoq.data.dataset import DataError
from aoq.data.karpathy import read_karpathy
from aoq.data.loaders import (
    CaptionDataset,
    ImageDataset,
    PairDataset,
    collate_captions,
    collate_images,
    collate_pairs,
    load_pixels,
)
from aoq.data.precomp import read_precomp
from aoq.data.vocab import Vocabulary
from tests.fixtures import write_karpathy_fixture, write_precomp_fixture


@pytest.fixture()
def precomp(tmp_path: Path):
    return read_precomp(write_precomp_fixture(tmp_path, splits={"train": 4}, regions=3, dim=6), "train")


@pytest.fixture()
def vocab(precomp) -> Vocabulary:
    return Vocabulary.build(precomp.captions, threshold=2)


def test_pair_item_region_features(precomp, vocab: Vocabulary) -> None:
    dataset = PairDataset(precomp, vocab)
    assert len(dataset) == 20
    image, tokens, c, i = dataset[7]
    assert (c, i) == (7, 1)
    assert image.dtype == torch.float32 and image.shape == (3, 6)
    np.testing.assert_array_equal(image.numpy(), np.asarray(precomp.features[1]))
    assert image.numpy().flags.writeable  # copied out of the read-only memory map
    assert tokens.dtype == torch.long and tokens.tolist() == vocab.encode(precomp.captions[7])
    assert tokens[0] == 1 and tokens[-1] == 2


def test_pair_item_global_features(tmp_path: Path, vocab: Vocabulary) -> None:
    split = read_precomp(write_precomp_fixture(tmp_path / "g", splits={"dev": 2}, regions=None, dim=5), "dev")
    image, _, c, i = PairDataset(split, vocab)[9]
    assert image.shape == (5,) and (c, i) == (9, 1)
    np.testing.assert_array_equal(image.numpy(), split.features[1])


def test_collate_pairs_pads_with_zero(precomp, vocab: Vocabulary) -> None:
    batch = next(iter(DataLoader(PairDataset(precomp, vocab), batch_size=6, collate_fn=collate_pairs)))
    assert sorted(batch) == ["caption_ids", "image_ids", "images", "lengths", "tokens"]
    assert batch["images"].shape == (6, 3, 6) and batch["images"].dtype == torch.float32
    assert batch["caption_ids"].tolist() == [0, 1, 2, 3, 4, 5]
    assert batch["image_ids"].tolist() == [0, 0, 0, 0, 0, 1]
    lengths = [len(vocab.encode(precomp.captions[c])) for c in range(6)]
    assert batch["lengths"].tolist() == lengths and batch["lengths"].dtype == torch.long
    assert batch["tokens"].dtype == torch.long and batch["tokens"].shape == (6, max(lengths))
    for row, n in enumerate(lengths):
        assert batch["tokens"][row, :n].tolist() == vocab.encode(precomp.captions[row])
        assert batch["tokens"][row, n:].eq(0).all()


def test_collate_pads_hand_made_sequences() -> None:
    batch = collate_captions([(torch.tensor([1, 5, 2]), 4), (torch.tensor([1, 2]), 9)])
    assert batch["tokens"].tolist() == [[1, 5, 2], [1, 2, 0]]
    assert batch["lengths"].tolist() == [3, 2] and batch["caption_ids"].tolist() == [4, 9]


def test_image_and_caption_datasets(precomp, vocab: Vocabulary) -> None:
    images = next(iter(DataLoader(ImageDataset(precomp), batch_size=10, collate_fn=collate_images)))
    assert images["images"].shape == (4, 3, 6) and images["image_ids"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(images["images"].numpy(), precomp.features)
    captions = CaptionDataset(precomp, vocab)
    assert len(captions) == 20
    batch = collate_captions([captions[c] for c in (3, 17)])
    assert batch["caption_ids"].tolist() == [3, 17]
    assert batch["tokens"][1, : batch["lengths"][1]].tolist() == vocab.encode(precomp.captions[17])


def test_pixels_from_karpathy_images(tmp_path: Path, vocab: Vocabulary) -> None:
    split = read_karpathy(write_karpathy_fixture(tmp_path, kind="coco", image_size=8)).split("dev")
    dataset = PairDataset(split, vocab, image_mode="pixels", image_size=16)
    image, _, c, i = dataset[6]
    assert (c, i) == (6, 1)
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    png = np.asarray(Image.open(split.image_paths[1]).convert("RGB"), dtype=np.float32) / 127.5 - 1
    # the fixture image is two flat areas, so the upscaled corners keep their exact colours
    np.testing.assert_allclose(image[:, 0, 0].numpy(), png[0, 0], atol=1e-6)
    np.testing.assert_allclose(image[:, -1, -1].numpy(), png[-1, -1], atol=1e-6)
    assert not np.allclose(png[0, 0], png[-1, -1])
    batch = collate_images([ImageDataset(split, "pixels", 16)[k] for k in range(3)])
    assert batch["images"].shape == (3, 3, 16, 16)


def test_load_pixels_values_and_modes(tmp_path: Path) -> None:
    red = load_pixels(Image.new("RGB", (5, 3), (255, 0, 0)), image_size=4)
    assert red.shape == (3, 4, 4)
    assert red[0].eq(1).all() and red[1].eq(-1).all() and red[2].eq(-1).all()
    grey = load_pixels(Image.new("L", (4, 4), 51), 4)  # grey-scale becomes 3 equal channels
    torch.testing.assert_close(grey, torch.full((3, 4, 4), 51 / 127.5 - 1))
    path = tmp_path / "rgba.png"
    Image.new("RGBA", (6, 6), (0, 255, 0, 10)).save(path)
    green = load_pixels(path, 8)
    assert green.shape == (3, 8, 8) and green[1].eq(1).all() and green[0].eq(-1).all()


def test_load_pixels_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"^{tmp_path / 'none.png'}: image file not found$"):
        load_pixels(tmp_path / "none.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match=f"^{bad}: not a readable image"):
        load_pixels(bad)


def test_image_mode_must_match_the_split(tmp_path: Path, precomp, vocab: Vocabulary) -> None:
    with pytest.raises(DataError, match=r"\(split train\): split has no image files; use image_mode='features'"):
        PairDataset(precomp, vocab, image_mode="pixels")
    karpathy = read_karpathy(write_karpathy_fixture(tmp_path / "k", kind="flickr30k")).split("test")
    with pytest.raises(DataError, match=r"\(split test\): split has no features; use image_mode='pixels'"):
        ImageDataset(karpathy, image_mode="features")
    with pytest.raises(ValueError, match="image_mode must be 'features' or 'pixels', got 'jpeg'"):
        ImageDataset(karpathy, image_mode="jpeg")
