"""Caption generation: five varied, COCO-like English sentences per scene.

Like human captions, most sentences are *not* exhaustive: one names a single object, another only
the count, another one spatial relation, another groups the objects by colour or shape. Templates,
synonyms, word order (``A left of B`` / ``B right of A``), optional attributes and surface style
(capital letter, final period) vary, so the text side cannot be parsed by a fixed pattern.
Whether a caption happens to mention what tells a scene apart from its family members is left to
chance, which is what makes near-duplicate scenes hard negatives.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from training.datasets.synth.scenes import Scene, SceneObject

CAPTIONS_PER_IMAGE = 5

_SHAPE_WORDS: dict[str, tuple[tuple[str, str], ...]] = {  # (singular, plural)
    "circle": (("circle", "circles"), ("disc", "discs"), ("round shape", "round shapes")),
    "square": (("square", "squares"), ("box", "boxes"), ("block", "blocks")),
    "triangle": (("triangle", "triangles"), ("triangular shape", "triangular shapes")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombuses"), ("diamond shape", "diamond shapes")),
    "cross": (("cross", "crosses"), ("plus sign", "plus signs")),
    "star": (("star", "stars"), ("star shape", "star shapes")),
    "hexagon": (("hexagon", "hexagons"), ("six sided shape", "six sided shapes")),
    "ring": (("ring", "rings"), ("hoop", "hoops"), ("donut", "donuts")),
}
_COLOUR_WORDS: dict[str, tuple[str, ...]] = {
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
_SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "tiny", "little"),
    "medium": ("medium", "medium sized", "mid sized"),
    "large": ("large", "big", "huge"),
}
_BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "white": ("white", "bright white"),
    "light gray": ("light gray", "light grey", "pale gray"),
    "gray": ("gray", "grey", "medium gray"),
    "dark gray": ("dark gray", "dark grey", "charcoal"),
    "black": ("black", "pitch black"),
    "beige": ("beige", "cream colored", "sand colored"),
}
_TEXTURE_WORDS: dict[str, tuple[str, ...]] = {
    "plain": ("plain", "flat", "uniform"),
    "grain": ("grainy", "noisy", "speckled"),
    "stripes": ("striped", "faintly striped", "lined"),
    "gradient": ("shaded", "softly shaded", "graded"),
}
_ZONE_WORDS: dict[tuple[int, int], tuple[str, ...]] = {  # (column, row) of the 3x3 grid
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
_RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over", "higher than"),
    "below": ("below", "under", "beneath", "underneath"),
}
_NUMBERS: dict[int, tuple[str, ...]] = {
    1: ("one", "a single"),
    2: ("two", "two", "a pair of", "2"),
    3: ("three", "three", "3"),
    4: ("four", "four", "4"),
}
_NOUNS = (("shape", "shapes"), ("object", "objects"), ("figure", "figures"), ("item", "items"))
_PREFIXES = ("", "", "", "a picture of ", "an image of ", "a drawing of ", "a photo of ", "there is ")


def _pick(rng: random.Random, options: Sequence[str]) -> str:
    return rng.choice(options)


def _chance(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _article(phrase: str) -> str:
    vowel_sound = phrase[0] in "aeiou" and not phrase.startswith("uni")  # "a uniform ..."
    return ("an " if vowel_sound else "a ") + phrase


def _number(rng: random.Random, n: int) -> str:
    return _pick(rng, _NUMBERS[n])


def _cardinal(rng: random.Random, n: int) -> str:
    """A number that reads well before "other" or "more" (never "a pair of")."""
    return _pick(rng, [w for w in _NUMBERS[n] if not w.startswith("a ")])


def _shape_word(rng: random.Random, shape: str, plural: bool = False) -> str:
    return _pick(rng, _SHAPE_WORDS[shape])[1 if plural else 0]


def _noun(rng: random.Random, plural: bool) -> str:
    return _pick(rng, _NOUNS)[1 if plural else 0]


def _bare(rng: random.Random, obj: SceneObject, p_size: float = 0.5, p_colour: float = 0.9) -> str:
    """``[size] [colour] shape`` without an article; the shape word may be a generic noun when a
    colour is named ("a red shape")."""
    words = []
    if _chance(rng, p_size):
        words.append(_pick(rng, _SIZE_WORDS[obj.size]))
    has_colour = _chance(rng, p_colour)
    if has_colour:
        words.append(_pick(rng, _COLOUR_WORDS[obj.colour]))
    generic = has_colour and _chance(rng, 0.1)
    words.append(_noun(rng, False) if generic else _shape_word(rng, obj.shape))
    return " ".join(words)


def _np(rng: random.Random, obj: SceneObject, **kw: float) -> str:
    return _article(_bare(rng, obj, **kw))


def _background(rng: random.Random, scene: Scene) -> str:
    words = [_pick(rng, _BACKGROUND_WORDS[scene.background])]
    if _chance(rng, 0.3):
        words.insert(0, _pick(rng, _TEXTURE_WORDS[scene.texture]))
    return _article(" ".join(words)) + " " + _pick(rng, ("background", "background", "backdrop", "surface"))


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _relation(a: SceneObject, b: SceneObject) -> str:
    """Where ``a`` is relative to ``b`` along the axis on which they are furthest apart."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}


def _count(rng: random.Random, scene: Scene, detail: float) -> str:
    n = len(scene.objects)
    if n == 1:
        return _pick(
            rng,
            (
                f"a single {_noun(rng, False)} on {_background(rng, scene)}",
                f"just one {_noun(rng, False)} in the picture",
                f"only one {_noun(rng, False)} is visible on {_background(rng, scene)}",
                f"{_background(rng, scene)} with one {_noun(rng, False)}",
            ),
        )
    num, nouns = _number(rng, n), _noun(rng, True)
    text = _pick(
        rng,
        (
            f"{num} {nouns} on {_background(rng, scene)}",
            f"there are {num} {nouns} in this {_pick(rng, ('image', 'picture', 'scene'))}",
            f"{_background(rng, scene)} with {num} {nouns}",
            f"{num} {nouns} {_pick(rng, ('placed', 'scattered', 'arranged'))} on {_background(rng, scene)}",
            f"a {_pick(rng, ('picture', 'scene', 'drawing'))} showing {num} different {nouns}",
        ),
    )
    if _chance(rng, detail):
        named = rng.sample(scene.objects, 2 if _chance(rng, detail) else 1)
        text += _pick(rng, (", including ", ", among them ")) + _join([_np(rng, o) for o in named])
    return text


def _single(rng: random.Random, scene: Scene, detail: float) -> str:
    obj = rng.choice(scene.objects)
    text = _pick(rng, _PREFIXES) + _np(rng, obj)
    if _chance(rng, 0.6):
        text += " " + _pick(rng, _ZONE_WORDS[obj.zone()])
    n = len(scene.objects)
    if n > 1 and _chance(rng, detail):
        others = _pick(rng, ("another", "one other")) if n == 2 else f"{_cardinal(rng, n - 1)} other"
        text += _pick(rng, (" among ", " and ", " with ")) + f"{others} {_noun(rng, n > 2)}"
    elif n > 1 and _chance(rng, 0.3):
        text += _pick(rng, (" among other shapes", " and some other shapes", " with a few other objects"))
    return text


def _relational(rng: random.Random, scene: Scene, detail: float) -> str:
    a, b = rng.sample(scene.objects, 2)
    rel = _relation(a, b)
    words = _pick(rng, _RELATION_WORDS[rel])
    inverse = _pick(rng, _RELATION_WORDS[_INVERSE[rel]])
    na, nb = _np(rng, a, p_size=0.3 + 0.3 * detail), _np(rng, b, p_size=0.3 + 0.3 * detail)
    verb = _pick(rng, ("is", "sits", "is placed", "appears"))
    text = _pick(
        rng,
        (
            f"{na} {words} {nb}",
            f"{na} {verb} {words} {nb}",
            f"{nb} {inverse} {na}",
            f"there is {nb} and {na} {words} it",
            f"{nb} with {na} {words} it",
        ),
    )
    rest = len(scene.objects) - 2
    if rest and _chance(rng, detail):
        text += _pick(rng, (", and ", ", plus ")) + ("one more shape" if rest == 1 else f"{_cardinal(rng, rest)} more shapes")
    return text


def _enumeration(rng: random.Random, scene: Scene, detail: float) -> str:
    p_size = 0.7 if _chance(rng, detail) else 0.0
    parts = [_np(rng, obj, p_size=p_size, p_colour=0.95) for obj in rng.sample(scene.objects, len(scene.objects))]
    text = _join(parts)
    if _chance(rng, 0.3):
        text = _pick(rng, ("a picture with ", "an image containing ", "this scene shows ")) + text
    return text


def _grouped(rng: random.Random, scene: Scene, detail: float) -> str:
    """Counts per colour or per shape: "two red shapes and a blue one", "two circles and a star"."""
    n = len(scene.objects)
    by_colour = _chance(rng, 0.5)
    groups = Counter(o.colour if by_colour else o.shape for o in scene.objects)
    if len(groups) == 1:
        (key,) = groups
        if by_colour:
            return _pick(
                rng,
                (
                    f"{_number(rng, n)} {_noun(rng, True)}, all of them {_pick(rng, _COLOUR_WORDS[key])}",
                    f"{_number(rng, n)} {_pick(rng, _COLOUR_WORDS[key])} {_noun(rng, True)}",
                ),
            )
        return _pick(
            rng,
            (
                f"{_number(rng, n)} {_shape_word(rng, key, plural=True)} of different colors",
                f"{_number(rng, n)} {_shape_word(rng, key, plural=True)}",
            ),
        )
    parts = []
    items = list(groups.items())
    for key, count in rng.sample(items, len(items)):
        if by_colour:
            noun = _noun(rng, count > 1)
            colour = _pick(rng, _COLOUR_WORDS[key])
            parts.append(_article(f"{colour} {noun}") if count == 1 else f"{_number(rng, count)} {colour} {noun}")
        else:
            word = _shape_word(rng, key, plural=count > 1)
            parts.append(_article(word) if count == 1 else f"{_number(rng, count)} {word}")
    return _join(parts)


def _partial(rng: random.Random, scene: Scene, detail: float) -> str:
    """One object named, the others only counted."""
    n = len(scene.objects)
    obj = rng.choice(scene.objects)
    rest = n - 1
    others = "another shape" if rest == 1 else f"{_cardinal(rng, rest)} other {_noun(rng, True)}"
    return _pick(
        rng,
        (
            f"one of the {_number(rng, n)} {_noun(rng, True)} is {_np(rng, obj)}",
            f"{_number(rng, n)} {_noun(rng, True)}, one of which is {_np(rng, obj)}",
            f"{_np(rng, obj)} and {others}",
            f"{_np(rng, obj)} together with {others}",
        ),
    )


def _sizes(rng: random.Random, scene: Scene, detail: float) -> str:
    """A size comparison between two objects of different size classes."""
    order = {"small": 0, "medium": 1, "large": 2}
    pairs = [
        (a, b) for a in scene.objects for b in scene.objects if order[a.size] > order[b.size]
    ]
    big, small = rng.choice(pairs)
    nb, ns = _np(rng, big, p_size=0.0), _np(rng, small, p_size=0.0)
    largest = max(order[o.size] for o in scene.objects)
    options = [
        f"{nb} {_pick(rng, ('bigger', 'larger'))} than {ns}",
        f"{nb} and a smaller {_bare(rng, small, p_size=0.0)}",
        f"{ns} next to a {_pick(rng, ('bigger', 'larger', 'much larger'))} {_bare(rng, big, p_size=0.0)}",
    ]
    if order[big.size] == largest and sum(order[o.size] == largest for o in scene.objects) == 1:
        options.append(f"the {_pick(rng, ('largest', 'biggest'))} {_noun(rng, False)} is {nb}")
    return _pick(rng, options)


def _lone(rng: random.Random, scene: Scene, detail: float) -> str:
    """The only object of a one-object scene, placed and on its background."""
    obj = scene.objects[0]
    np_ = _np(rng, obj, p_size=0.8)
    return _pick(
        rng,
        (
            f"{np_} {_pick(rng, _ZONE_WORDS[obj.zone()])} of {_background(rng, scene)}",
            f"{_background(rng, scene)} with {np_} {_pick(rng, _ZONE_WORDS[obj.zone()])}",
            f"{np_} alone on {_background(rng, scene)}",
        ),
    )


_Template = Callable[[random.Random, Scene, float], str]


#: kinds that name one object or only a count ("vague") lose weight as ``detail`` grows; kinds
#: that name several objects and how they relate ("specific") gain weight.
_VAGUE = ("_count", "_single", "_partial")


def _templates(scene: Scene, detail: float) -> list[tuple[_Template, float]]:
    """The caption kinds that make sense for this scene, with their weights at this ``detail``."""
    n = len(scene.objects)
    if n == 1:
        return [(_count, 1.0), (_single, 1.5), (_lone, 1.2), (_enumeration, 0.6)]
    kinds: list[tuple[_Template, float]] = [
        (_count, 0.6),
        (_single, 1.0),
        (_relational, 1.3),
        (_enumeration, 1.2),
        (_grouped, 0.9),
        (_partial, 0.8),
    ]
    if len({o.size for o in scene.objects}) > 1:
        kinds.append((_sizes, 0.6))
    return [(t, w * (1 - 0.7 * detail if t.__name__ in _VAGUE else 1 + detail)) for t, w in kinds]


def _style(rng: random.Random, text: str) -> str:
    if _chance(rng, 0.5):
        text = text[0].upper() + text[1:]
    if _chance(rng, 0.4):
        text += "."
    return text


def _weighted_sample(rng: random.Random, kinds: list[tuple[_Template, float]], k: int) -> list[_Template]:
    """``k`` templates, each used at most twice, drawn one by one with probability proportional
    to weight."""
    pool = list(kinds) * 2
    chosen = []
    for _ in range(k):
        i = rng.choices(range(len(pool)), [w for _, w in pool])[0]
        chosen.append(pool.pop(i)[0])
    return chosen


def _mentions_background(text: str) -> bool:
    return any(word in text for word in (" background", " backdrop", " surface"))


def _caption(rng: random.Random, scene: Scene, template: _Template, detail: float) -> str:
    """One caption of ``template``, with the background added with probability ``detail``."""
    text = template(rng, scene, detail)
    if not _mentions_background(text) and _chance(rng, detail):
        text += " on " + _background(rng, scene)
    return text


def caption_scene(scene: Scene, rng: random.Random, detail: float, n: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """``n`` captions of ``scene``.

    Caption kinds are drawn by weight, each at most twice (then with replacement if a scene
    has too few kinds); a duplicate sentence is redrawn when possible. ``detail`` (0..1) is the
    probability of each optional extra fact (the background, the number of other objects, one
    more object, sizes) and shifts the mix from one-object and count captions to captions
    that name several objects: it sets how specific, hence how easy to retrieve, captions are.
    """
    kinds = _templates(scene, detail)
    order = _weighted_sample(rng, kinds, min(n, 2 * len(kinds)))
    order += rng.choices([t for t, _ in kinds], [w for _, w in kinds], k=n - len(order))
    seen: set[str] = set()
    captions: list[str] = []
    for template in order:
        text = _caption(rng, scene, template, detail)
        for _ in range(10):
            if text not in seen:
                break
            text = _caption(rng, scene, template, detail)
        seen.add(text)
        captions.append(_style(rng, text))
    return captions
