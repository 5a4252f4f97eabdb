"""One entry point from a run's ``data`` configuration to a split, whatever the format."""

from __future__ import annotations

from aoq.config import DataConfig
from aoq.data.dataset import SplitData
from aoq.data.karpathy import read_karpathy
from aoq.data.precomp import read_precomp

#: Karpathy's own label for the dev split, accepted as a split name for that format.
_KARPATHY_ALIASES = {"val": "dev"}


def split_name(data_cfg: DataConfig, split: str) -> str:
    """The dataset's name for a role: ``train``/``dev``/``test`` map through the config
    (``data.test_split=testall`` picks SCAN's COCO 5K file); any other name passes through."""
    roles = {"train": data_cfg.train_split, "dev": data_cfg.dev_split, "test": data_cfg.test_split}
    return roles.get(split, split)


def load_split(data_cfg: DataConfig, split: str) -> SplitData:
    """Read one split described by ``data_cfg``.

    Args:
        data_cfg: the run's data section (format, path, image_root, split names, ...).
        split: ``train``, ``dev`` or ``test`` (mapped through the config), or a file-level name.

    Returns:
        The split; the dev split is cut to ``data_cfg.max_dev_images`` images when set; with
        ``data_cfg.regions``, its cached backbone regions in ``features`` (computed on the first
        read of these images).

    Raises:
        DataError: from the readers (missing files, unknown split, bad content).
    """
    name = split_name(data_cfg, split)
    if data_cfg.format == "precomp":
        data = read_precomp(data_cfg.path, name, captions_per_image=data_cfg.captions_per_image)
    else:
        dataset = read_karpathy(data_cfg.path, data_cfg.image_root, data_cfg.captions_per_image)
        data = dataset.split(_KARPATHY_ALIASES.get(name, name))
    if data_cfg.max_dev_images is not None and name == data_cfg.dev_split:
        data = data.subset(data_cfg.max_dev_images)
    if data_cfg.regions is not None:
        from aoq.backbone_regions import with_region_features  # torch and the backbone, only when asked

        data = with_region_features(data)
    return data
