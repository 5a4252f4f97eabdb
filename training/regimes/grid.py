"""The cells of the regime map (docs/regimes.md): which synthetic sets ``aoq regimes`` trains on.

A cell fixes some of ``aoq synth``'s difficulty knobs (the rest keep their defaults) and the
training-set size. Every replicate of a cell gets its own set, generated with a seed derived
from the cell and the replicate only (:func:`data_seed`), so the same cell and replicate give the
same set in any process, and the four arms of a replicate share it (paired). The pilot varies
one knob at a time (one replicate per level); the grid crosses the levels of two knobs.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from aoq_train.datasets.synth.scenes import SceneParams

#: the knob that is not a scene parameter: training images per set
TRAIN = "train"
#: knob -> the levels the pilot tries (the middle one is the default where there is one)
LEVELS: dict[str, tuple[float | int, ...]] = {
    "family_share": (0.1, 0.5, 0.9),
    "max_variants": (1, 3, 5),
    "caption_detail": (0.2, 0.5, 0.8),
    "contrast_captions": (0, 2, 4),
    "noise": (0.3, 1.0, 1.8),
    TRAIN: (1000, 2000, 4000),
}
#: the set sizes every cell shares unless its knobs say otherwise (sized for the 2-core machine)
SIZES = {"train": 2000, "dev": 300, "test": 1000}
_PARAMS = {f.name for f in fields(SceneParams)}


@dataclass(frozen=True)
class Cell:
    """Knob values, as sorted (name, value) pairs; unnamed knobs keep their defaults."""

    knobs: tuple[tuple[str, float | int], ...]

    @classmethod
    def of(cls, **knobs: float | int) -> Cell:
        unknown = sorted(set(knobs) - set(LEVELS))
        if unknown:
            raise ValueError(f"unknown knob(s) {unknown}; choose from {sorted(LEVELS)}")
        return cls(tuple(sorted(knobs.items())))

    @property
    def name(self) -> str:
        """A folder name: ``caption_detail=0.2,family_share=0.9`` (``default`` without knobs)."""
        return ",".join(f"{k}={v}" for k, v in self.knobs) or "default"

    def params(self, base: SceneParams | None = None) -> SceneParams:
        """The scene parameters of this cell (``base``'s, then the cell's knobs)."""
        return replace(base or SceneParams(), **{k: v for k, v in self.knobs if k in _PARAMS})

    def sizes(self, base: dict[str, int] | None = None) -> dict[str, int]:
        """Images per split: ``base`` (default :data:`SIZES`) with the cell's training size."""
        sizes = dict(base or SIZES)
        sizes.update({"train": int(v) for k, v in self.knobs if k == TRAIN})
        return sizes

    def value(self, knob: str) -> float | int:
        """This cell's level of ``knob`` (the default when the cell does not set it)."""
        named = dict(self.knobs)
        if knob in named:
            return named[knob]
        return SIZES["train"] if knob == TRAIN else asdict(SceneParams())[knob]


def data_seed(cell: Cell, replicate: int) -> int:
    """The generator seed of a cell's replicate: a hash of both, the same in every process."""
    digest = hashlib.sha256(f"{cell.name}/{replicate}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def pilot_cells(levels: dict[str, tuple[float | int, ...]] | None = None) -> list[Cell]:
    """One cell per level of each knob (``levels`` default :data:`LEVELS`), the others at their defaults."""
    return [Cell.of(**{knob: level}) for knob, values in (levels or LEVELS).items() for level in values]


def grid_cells(first: str, second: str, levels: dict[str, tuple[float | int, ...]] | None = None) -> list[Cell]:
    """The cross of two knobs' levels (``levels`` default :data:`LEVELS`)."""
    if first == second:
        raise ValueError(f"the grid needs two different knobs, got {first!r} twice")
    levels = levels or LEVELS
    return [Cell.of(**{first: a, second: b}) for a, b in itertools.product(levels[first], levels[second])]


def cell_data(root: Path, cell: Cell, replicate: int) -> Path:
    """Where a cell's replicate set lives."""
    return root / cell.name / f"rep{replicate}"


def ensure_cell_data(root: Path, cell: Cell, replicate: int, sizes: dict[str, int] | None = None,
                     progress: bool = True) -> Path:
    """Generate a cell's replicate set unless it is there already (same sizes, seed and scene
    parameters); returns its folder."""
    from aoq_train.datasets.synth.writer import ensure_dataset

    out = cell_data(root, cell, replicate)
    ensure_dataset(out, cell.sizes(sizes), seed=data_seed(cell, replicate), workers=1, progress=progress,
                   params=cell.params())
    return out
