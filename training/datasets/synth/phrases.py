"""The words of the synthetic captions: synonyms for every shape, colour, size, place and
relation, and the noun phrases built from them, each returned with the facts it states
(:mod:`aoq.data.facts`; ``?k`` is object ``k`` of the scene). :mod:`.captions` assembles
sentences from these phrases."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from aoq_train.datasets.synth.facts import ZONE_NAMES
from aoq_train.datasets.synth.scenes import Scene, SceneObject

SHAPE_WORDS: dict[str, tuple[tuple[str, str], ...]] = {  # (singular, plural)
    "circle": (("circle", "circles"), ("disc", "discs"), ("round shape", "round shapes")),
    "square": (("square", "squares"), ("box", "boxes"), ("block", "blocks")),
    "triangle": (("triangle", "triangles"), ("triangular shape", "triangular shapes")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombuses"), ("diamond shape", "diamond shapes")),
    "cross": (("cross", "crosses"), ("plus sign", "plus signs")),
    "star": (("star", "stars"), ("star shape", "star shapes")),
    "hexagon": (("hexagon", "hexagons"), ("six sided shape", "six sided shapes")),
    "ring": (("ring", "rings"), ("hoop", "hoops"), ("donut", "donuts")),
}
COLOUR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red", "red", "bright red"),
    "green": ("green", "green", "grass green"),
    "blue": ("blue", "blue", "deep blue"),
    "yellow": ("yellow", "yellow", "golden"),
    "purple": ("purple", "purple", "violet"),
    "orange": ("orange",),
    "pink": ("pink", "pink", "rosy"),
    "cyan": ("cyan", "turquoise", "teal"),
    "brown": ("brown", "brown", "chocolate"),
}
SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "tiny", "little"),
    "medium": ("medium", "medium sized", "mid sized"),
    "large": ("large", "big", "huge"),
}
BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "white": ("white", "bright white"),
    "light gray": ("light gray", "light grey", "pale gray"),
    "gray": ("gray", "grey", "medium gray"),
    "dark gray": ("dark gray", "dark grey", "charcoal"),
    "black": ("black", "pitch black"),
    "beige": ("beige", "cream colored", "sand colored"),
}
TEXTURE_WORDS: dict[str, tuple[str, ...]] = {
    "plain": ("plain", "flat", "uniform"),
    "grain": ("grainy", "noisy", "speckled"),
    "stripes": ("striped", "faintly striped", "lined"),
    "gradient": ("shaded", "softly shaded", "graded"),
}
ZONE_WORDS: dict[tuple[int, int], tuple[str, ...]] = {  # (column, row) of the 3x3 grid
    (0, 0): ("in the top left corner", "at the top left", "in the upper left"),
    (1, 0): ("at the top", "near the top", "in the upper part"),
    (2, 0): ("in the top right corner", "at the top right", "in the upper right"),
    (0, 1): ("on the left", "on the left side", "at the left"),
    (1, 1): ("in the middle", "in the center", "in the centre"),
    (2, 1): ("on the right", "on the right side", "at the right"),
    (0, 2): ("in the bottom left corner", "at the bottom left", "in the lower left"),
    (1, 2): ("at the bottom", "near the bottom", "in the lower part"),
    (2, 2): ("in the bottom right corner", "at the bottom right", "in the lower right"),
}
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over", "higher than"),
    "below": ("below", "under", "beneath", "underneath"),
}
NUMBERS: dict[int, tuple[str, ...]] = {
    1: ("one", "a single"),
    2: ("two", "two", "a pair of", "2"),
    3: ("three", "three", "3"),
    4: ("four", "four", "4"),
}
NOUNS = (("shape", "shapes"), ("object", "objects"), ("figure", "figures"), ("item", "items"))
PREFIXES = ("", "", "", "a picture of ", "an image of ", "a drawing of ", "a photo of ", "there is ")


Facts = tuple[str, ...]


class Caption(NamedTuple):
    """A caption's text and the facts it states (sorted, each once)."""

    text: str
    facts: Facts


def pick(rng: random.Random, options: Sequence[str]) -> str:
    return rng.choice(options)


def chance(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def article(phrase: str) -> str:
    vowel_sound = phrase[0] in "aeiou" and not phrase.startswith("uni")  # "a uniform ..."
    return ("an " if vowel_sound else "a ") + phrase


def number(rng: random.Random, n: int) -> str:
    return pick(rng, NUMBERS[n])


def cardinal(rng: random.Random, n: int) -> str:
    """A number that reads well before "other" or "more" (never "a pair of")."""
    return pick(rng, [w for w in NUMBERS[n] if not w.startswith("a ")])


def shape_word(rng: random.Random, shape: str, plural: bool = False) -> str:
    return pick(rng, SHAPE_WORDS[shape])[1 if plural else 0]


def noun(rng: random.Random, plural: bool) -> str:
    return pick(rng, NOUNS)[1 if plural else 0]


def var(scene: Scene, obj: SceneObject) -> str:
    """The fact variable of ``obj``: its index in the scene it belongs to."""
    return f"?{scene.objects.index(obj)}"


def bare_phrase(
    rng: random.Random, scene: Scene, obj: SceneObject, p_size: float = 0.5, p_colour: float = 0.9
) -> tuple[str, Facts]:
    """``[size] [colour] shape`` without an article; the shape word may be a generic noun when a
    colour is named ("a red shape")."""
    v = var(scene, obj)
    words, facts = [], []
    if chance(rng, p_size):
        words.append(pick(rng, SIZE_WORDS[obj.size]))
        facts.append(f"size({v},{obj.size})")
    has_colour = chance(rng, p_colour)
    if has_colour:
        words.append(pick(rng, COLOUR_WORDS[obj.colour]))
        facts.append(f"colour({v},{obj.colour})")
    generic = has_colour and chance(rng, 0.1)
    if generic:
        words.append(noun(rng, False))
    else:
        words.append(shape_word(rng, obj.shape))
        facts.append(f"shape({v},{obj.shape})")
    return " ".join(words), tuple(facts)


def noun_phrase(rng: random.Random, scene: Scene, obj: SceneObject, **kw: float) -> tuple[str, Facts]:
    text, facts = bare_phrase(rng, scene, obj, **kw)
    return article(text), facts


def full_phrase(rng: random.Random, scene: Scene, obj: SceneObject) -> tuple[str, Facts]:
    """``a <size> <colour> <shape>``: every attribute named, as a contrastive caption needs."""
    v = var(scene, obj)
    text = " ".join((pick(rng, SIZE_WORDS[obj.size]), pick(rng, COLOUR_WORDS[obj.colour]),
                     shape_word(rng, obj.shape)))
    return article(text), (f"size({v},{obj.size})", f"colour({v},{obj.colour})", f"shape({v},{obj.shape})")


def zone_phrase(rng: random.Random, scene: Scene, obj: SceneObject) -> tuple[str, Facts]:
    return pick(rng, ZONE_WORDS[obj.zone()]), (f"zone({var(scene, obj)},{ZONE_NAMES[obj.zone()]})",)


def background_phrase(rng: random.Random, scene: Scene) -> tuple[str, Facts]:
    words = [pick(rng, BACKGROUND_WORDS[scene.background])]
    facts = [f"bg({scene.background})"]
    if chance(rng, 0.3):
        words.insert(0, pick(rng, TEXTURE_WORDS[scene.texture]))
        facts.append(f"texture({scene.texture})")
    text = article(" ".join(words)) + " " + pick(rng, ("background", "background", "backdrop", "surface"))
    return text, tuple(facts)


def join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
