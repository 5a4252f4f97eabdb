"""The synthetic benchmark's scene-based checks of a seed's mined lists (``aoq report --synth``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def scene_diagnostics(run_dir: Path, data_dir: Path, h_t: int) -> dict[str, float]:
    """How hard and how clean the mined negatives are, from the generator's scene records.

    * ``family_top1``: share of training images whose hardest mined caption describes a scene of
      the same family (a one-change near-duplicate): the negatives AOQ is meant to find.
    * ``same_objects_top1`` / ``same_objects``: share of images whose hardest mined caption (and
      of all mined pairs within the sampled depth ``h_t``) comes from a scene with exactly the
      same objects by shape and colour. Captions that leave out sizes and positions, which many
      do, are then true descriptions of the anchor: likely false negatives.
    * ``duplicate_text``: share of the mined pairs within ``h_t`` whose text equals one of the
      image's own captions: certain false negatives
      (:func:`aoq_train.mining.diagnostics.certain_false_negatives`).
    """
    from aoq.mined import load_mined
    from aoq_train.mining.diagnostics import certain_false_negatives

    mined = load_mined(run_dir / "mined")
    scenes = sorted((json.loads(line) for line in (data_dir / "scenes.jsonl").read_text().splitlines()
                     if '"split": "train"' in line), key=lambda s: s["index"])
    family = np.array([s["family"] for s in scenes])
    objects = [tuple(sorted((o["shape"], o["colour"]) for o in s["objects"])) for s in scenes]
    ids = {o: i for i, o in enumerate(dict.fromkeys(objects))}
    content = np.array([ids[o] for o in objects])
    captions = (data_dir / "precomp" / "train_caps.txt").read_text().splitlines()
    cpi = len(captions) // len(family)
    owner = np.asarray(mined.img_top_caps[:, :h_t]) // cpi
    return {
        "family_top1": float(np.mean(family[owner[:, 0]] == family)),
        "same_objects_top1": float(np.mean(content[owner[:, 0]] == content)),
        "same_objects": float(np.mean(content[owner] == content[:, None])),
        "duplicate_text": certain_false_negatives(mined.img_top_caps, captions, cpi, h_t)["pairs"],
    }
