"""Scene sampling for the synthetic benchmark: what is in each picture, before any pixel exists.

A scene is 1-4 flat shapes (shape, colour, size class, centre) on a grey-ish background. Scenes
come in *families*: a base scene plus 1-3 variants that each differ from the base by exactly one
thing (one object's colour, shape or size, one object more or less, two objects swapped, one
object moved to another part of the picture). Family members sit next to each other in the same
split, so every split holds near-duplicates: the offline hard negatives AOQ mines and exploits.

Randomness is keyed, never sequential across images: :func:`rng_for` derives an independent
generator from ``(seed, split, stream, key)``, so an image's content does not depend on how many
images come before it, on the worker that draws it, or on the split sizes (a 1,000-image test
split is the prefix of a 5,000-image one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

#: shapes in the order the ``n_shapes`` knob takes them (the last two are the hardest to tell
#: apart from the first ones at 64 px, so they are off by default).
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross", "star", "hexagon", "ring")

#: saturated colours, each at least ~60 levels away (in some channel) from every background below,
#: so the pixel extractor can always separate objects from the background.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 225),
    "yellow": (235, 205, 30),
    "purple": (145, 60, 195),
    "orange": (245, 135, 20),
    "pink": (245, 115, 185),
    "cyan": (30, 200, 215),
    "brown": (150, 90, 40),
}

#: object radius (half the side of its bounding square) as a fraction of the image side.
SIZES: dict[str, float] = {"small": 0.075, "medium": 0.12, "large": 0.175}

#: low-saturation backgrounds: caption words come from ``captions.py``.
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (240, 240, 236),
    "light gray": (200, 200, 200),
    "gray": (140, 140, 140),
    "dark gray": (60, 60, 64),
    "black": (22, 22, 22),
    "beige": (225, 215, 190),
}

#: background textures; their amplitude is ``TEXTURE_AMPLITUDE * noise`` grey levels.
TEXTURES: tuple[str, ...] = ("plain", "grain", "stripes", "gradient")

#: variant kinds and how often each is drawn.
PERTURBATIONS: dict[str, float] = {
    "colour": 0.2,
    "shape": 0.2,
    "size": 0.15,
    "count": 0.2,
    "relation": 0.15,
    "position": 0.1,
}

SPLIT_CODES: dict[str, int] = {"train": 0, "dev": 1, "test": 2}

#: random streams of :func:`rng_for`.
STREAM_PLAN, STREAM_FAMILY, STREAM_RENDER, STREAM_CAPTIONS, STREAM_CONTRAST = 0, 1, 2, 3, 4

#: gap between objects' bounding squares and from the picture's edge, as a fraction of the side:
#: objects never touch, so each one is a separate connected component in the pixels.
_GAP = 0.05
_MARGIN = 0.035
_SIZE_JITTER = 0.008
_COLOUR_JITTER = 12
_PLACEMENT_TRIES = 200
_VARIANT_TRIES = 50


@dataclass(frozen=True)
class SceneParams:
    """The difficulty knobs of the benchmark.

    Attributes:
        image_size: side of the rendered square PNG in pixels.
        family_share: expected fraction of images that belong to a family (base + variants);
            the rest are independent scenes. Higher = more near-duplicates = harder.
        n_shapes: how many of :data:`SHAPES` are used (2..8).
        n_colours: how many of :data:`COLOURS` are used (2..9).
        noise: scales the background texture, the per-object colour jitter and the size jitter
            (0 = flat colours and exact sizes).
        min_objects, max_objects: objects per scene (1..4).
        max_variants: each family has 1..max_variants variants besides its base.
        caption_detail: probability of each optional extra fact in a caption (the background,
            the number of other objects, one more object): higher = more specific captions =
            easier retrieval.
        contrast_captions: how many of each family member's captions (the last ones) state
            what tells it apart from a sibling, checked to be false for that sibling (0 = none:
            captions are drawn without regard to the family).
    """

    image_size: int = 64
    family_share: float = 0.5
    n_shapes: int = 6
    n_colours: int = 8
    noise: float = 1.0
    min_objects: int = 1
    max_objects: int = 4
    max_variants: int = 3
    caption_detail: float = 0.8
    contrast_captions: int = 0

    def __post_init__(self) -> None:
        checks = [
            (16 <= self.image_size <= 1024, f"image_size must be in 16..1024, got {self.image_size}"),
            (0.0 <= self.family_share <= 1.0, f"family_share must be in [0, 1], got {self.family_share}"),
            (2 <= self.n_shapes <= len(SHAPES), f"n_shapes must be in 2..{len(SHAPES)}, got {self.n_shapes}"),
            (
                2 <= self.n_colours <= len(COLOURS),
                f"n_colours must be in 2..{len(COLOURS)}, got {self.n_colours}",
            ),
            (0.0 <= self.noise <= 2.0, f"noise must be in [0, 2], got {self.noise}"),
            (
                1 <= self.min_objects <= self.max_objects <= 4,
                f"need 1 <= min_objects <= max_objects <= 4, got {self.min_objects}..{self.max_objects}",
            ),
            (1 <= self.max_variants <= 5, f"max_variants must be in 1..5, got {self.max_variants}"),
            (
                0.0 <= self.caption_detail <= 1.0,
                f"caption_detail must be in [0, 1], got {self.caption_detail}",
            ),
            (
                0 <= self.contrast_captions <= 5,
                f"contrast_captions must be in 0..5, got {self.contrast_captions}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def shapes(self) -> tuple[str, ...]:
        return SHAPES[: self.n_shapes]

    @property
    def colours(self) -> tuple[str, ...]:
        return tuple(COLOURS)[: self.n_colours]


@dataclass(frozen=True)
class SceneObject:
    """One shape. ``x, y`` is the centre and ``r`` the half side of its bounding square, all as
    fractions of the image side; ``rgb`` is the jittered colour actually painted."""

    shape: str
    colour: str
    size: str
    x: float
    y: float
    r: float
    rgb: tuple[int, int, int]

    def zone(self) -> tuple[int, int]:
        """Column and row (0, 1, 2) of the 3x3 grid the centre falls in (captions' "top left"...)."""
        return _third(self.x), _third(self.y)


@dataclass(frozen=True)
class Scene:
    """A picture's content. ``family`` groups a base with its variants; ``variant`` is ``"base"``,
    ``"single"`` (no family) or the perturbation kind that made it from its base. ``changed``
    holds the indices of the objects the change touched: the same in the base and the variant
    for ``colour``, ``shape``, ``size``, ``position`` and ``relation`` (two objects); for
    ``count`` the added object's index in the variant or the removed one's in the base."""

    background: str
    texture: str
    objects: tuple[SceneObject, ...]
    family: int
    variant: str
    changed: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready description (``scenes.jsonl``); floats rounded so the file is readable."""
        objects = [
            {
                "shape": o.shape,
                "colour": o.colour,
                "size": o.size,
                "x": round(o.x, 4),
                "y": round(o.y, 4),
                "r": round(o.r, 4),
                "rgb": list(o.rgb),
            }
            for o in self.objects
        ]
        return {
            "background": self.background,
            "texture": self.texture,
            "objects": objects,
            "family": self.family,
            "variant": self.variant,
            "changed": list(self.changed),
        }

    def labels(self) -> list[str]:
        """The scene's object classes as labels (``"shape:circle"``, ...), sorted, each once."""
        return sorted({f"shape:{o.shape}" for o in self.objects})

    def signature(self) -> tuple:
        """What a caption could tell apart: attributes and coarse positions of every object."""
        return tuple(sorted((o.shape, o.colour, o.size, round(o.x, 2), round(o.y, 2)) for o in self.objects))


def rng_for(seed: int, split: str, stream: int, key: int) -> random.Random:
    """An independent generator for one (split, stream, key); identical on every run and worker.

    A string seed is hashed with SHA-512 by :class:`random.Random` (not with Python's salted
    ``hash``), and Python's generator is several times cheaper per draw than numpy's for the
    thousands of scalar draws a scene and its captions need.
    """
    return random.Random(f"aoq-synth/{seed}/{SPLIT_CODES[split]}/{stream}/{key}")


def family_plan(n_images: int, params: SceneParams, seed: int, split: str) -> list[tuple[int, int]]:
    """Cut a split's ``n_images`` into families: a list of ``(first_image_index, size)``.

    Each group is a family (1 + Uniform{1..max_variants} images) with probability ``p`` chosen so
    that the expected share of images in families is ``family_share``; otherwise a single scene.
    The sequence does not depend on ``n_images`` except that the last family may be cut short.
    """
    mean_size = 1 + (1 + params.max_variants) / 2
    f = params.family_share
    p = f / (mean_size - (mean_size - 1) * f)
    rng = rng_for(seed, split, STREAM_PLAN, 0)
    plan: list[tuple[int, int]] = []
    start = 0
    while start < n_images:
        size = 1 + rng.randint(1, params.max_variants) if rng.random() < p else 1
        size = min(size, n_images - start)
        plan.append((start, size))
        start += size
    return plan


def sample_family(params: SceneParams, seed: int, split: str, family: int, size: int) -> list[Scene]:
    """The scenes of one family: its base first, then ``size - 1`` distinct one-change variants.

    A variant that cannot be made distinct (tiny knob settings) falls back to an independent scene.
    """
    rng = rng_for(seed, split, STREAM_FAMILY, family)
    base = _sample_scene(params, rng, family, "base" if size > 1 else "single")
    scenes = [base]
    seen = {base.signature()}
    kinds, weights = list(PERTURBATIONS), list(PERTURBATIONS.values())
    for _ in range(size - 1):
        variant = None
        for _ in range(_VARIANT_TRIES):
            kind = rng.choices(kinds, weights)[0]
            candidate = _perturb(base, kind, params, rng)
            if candidate is not None and candidate.signature() not in seen:
                variant = candidate
                break
        if variant is None:
            variant = _sample_scene(params, rng, family, "single")
        seen.add(variant.signature())
        scenes.append(variant)
    return scenes


def _third(v: float) -> int:
    return 0 if v < 1 / 3 else (2 if v > 2 / 3 else 1)


def _jitter_colour(name: str, params: SceneParams, rng: random.Random) -> tuple[int, int, int]:
    amp = int(round(_COLOUR_JITTER * params.noise))
    r, g, b = (min(255, max(0, v + rng.randint(-amp, amp))) for v in COLOURS[name])
    return r, g, b


def _radius(size: str, params: SceneParams, rng: random.Random) -> float:
    return SIZES[size] + rng.uniform(-1, 1) * _SIZE_JITTER * params.noise


def _fits(obj: SceneObject, others: tuple[SceneObject, ...] | list[SceneObject]) -> bool:
    """Inside the picture's margin and apart from every other object's (padded) bounding square."""
    if not (_MARGIN + obj.r <= obj.x <= 1 - _MARGIN - obj.r and _MARGIN + obj.r <= obj.y <= 1 - _MARGIN - obj.r):
        return False
    for o in others:
        if abs(o.x - obj.x) < o.r + obj.r + _GAP and abs(o.y - obj.y) < o.r + obj.r + _GAP:
            return False
    return True


def _place(obj: SceneObject, others, rng: random.Random, avoid_zone=None) -> SceneObject | None:
    """``obj`` at a random free position (optionally outside the zone ``avoid_zone``), or None."""
    lo, hi = _MARGIN + obj.r, 1 - _MARGIN - obj.r
    for _ in range(_PLACEMENT_TRIES):
        moved = replace(obj, x=rng.uniform(lo, hi), y=rng.uniform(lo, hi))
        if avoid_zone is not None and moved.zone() == avoid_zone:
            continue
        if _fits(moved, others):
            return moved
    return None


def _new_object(params: SceneParams, rng: random.Random, others) -> SceneObject | None:
    shape = rng.choice(params.shapes)
    colour = rng.choice(params.colours)
    size = rng.choice(tuple(SIZES))
    radius, rgb = _radius(size, params, rng), _jitter_colour(colour, params, rng)
    obj = SceneObject(shape, colour, size, 0.5, 0.5, radius, rgb)
    return _place(obj, others, rng)


def _sample_scene(params: SceneParams, rng: random.Random, family: int, variant: str) -> Scene:
    background = rng.choice(tuple(BACKGROUNDS))
    texture = rng.choice(TEXTURES)
    while True:  # four large objects do not always fit: redraw until they do (rare)
        n = rng.randint(params.min_objects, params.max_objects)
        objects: list[SceneObject] = []
        for _ in range(n):
            obj = _new_object(params, rng, objects)
            if obj is None:
                break
            objects.append(obj)
        if len(objects) == n:
            return Scene(background, texture, tuple(objects), family, variant)


def _perturb(base: Scene, kind: str, params: SceneParams, rng: random.Random) -> Scene | None:
    """``base`` changed in one way of ``kind``, or None when that change is impossible here."""
    objs = list(base.objects)
    i = rng.randrange(len(objs))
    o = objs[i]
    changed: tuple[int, ...] = (i,)
    if kind == "colour":
        choices = [c for c in params.colours if c != o.colour]
        colour = rng.choice(choices)
        objs[i] = replace(o, colour=colour, rgb=_jitter_colour(colour, params, rng))
    elif kind == "shape":
        choices = [s for s in params.shapes if s != o.shape]
        objs[i] = replace(o, shape=rng.choice(choices))
    elif kind == "size":
        choices = [s for s in SIZES if s != o.size]
        size = rng.choice(choices)
        objs[i] = replace(o, size=size, r=_radius(size, params, rng))
        if not _fits(objs[i], objs[:i] + objs[i + 1 :]):
            return None
    elif kind == "count":
        can_add, can_remove = len(objs) < params.max_objects, len(objs) > params.min_objects
        if can_remove and (not can_add or rng.random() < 0.5):
            del objs[i]
        elif can_add:
            new = _new_object(params, rng, objs)
            if new is None:
                return None
            objs.append(new)
            changed = (len(objs) - 1,)
        else:
            return None
    elif kind == "relation":
        # swap the places of two objects that look different: "A left of B" becomes "B left of A"
        others = [j for j, p in enumerate(objs) if (p.shape, p.colour) != (o.shape, o.colour)]
        if not others:
            return None
        j = rng.choice(others)
        p = objs[j]
        objs[i], objs[j] = replace(o, x=p.x, y=p.y), replace(p, x=o.x, y=o.y)
        changed = (i, j)
        rest = [q for k, q in enumerate(objs) if k not in (i, j)]
        if not (_fits(objs[i], rest + [objs[j]]) and _fits(objs[j], rest)):
            return None
    elif kind == "position":
        moved = _place(o, objs[:i] + objs[i + 1 :], rng, avoid_zone=o.zone())
        if moved is None:
            return None
        objs[i] = moved
    else:
        raise ValueError(f"unknown perturbation {kind!r}")
    return Scene(base.background, base.texture, tuple(objs), base.family, kind, changed)
