"""Caption generation: five varied, COCO-like English sentences per scene.

Like human captions, most sentences are *not* exhaustive: one names a single object, another only
the count, another one spatial relation, another groups the objects by colour or shape. Templates,
synonyms, word order (``A left of B`` / ``B right of A``), optional attributes and surface style
(capital letter, final period) vary, so the text side cannot be parsed by a fixed pattern.
Whether a caption happens to mention what tells a scene apart from its family members is left to
chance, which is what makes near-duplicate scenes hard negatives, unless ``contrast_captions``
asks for captions that state the difference (:func:`caption_family`).

Every caption comes with the facts it states (:mod:`aoq.data.facts`; ``?k`` is object ``k`` of
the scene it was written for), recorded as the text is built, so a caption's facts are exactly
what its words claim and can be checked against any other scene's ground facts
(:func:`aoq_train.datasets.synth.facts.scene_facts`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from aoq.data.facts import facts_hold, index_facts, parse_fact
from aoq_train.datasets.synth.facts import relation, relation_fact, scene_facts
from aoq_train.datasets.synth.phrases import (
    COLOUR_WORDS,
    Caption,
    Facts,
    PREFIXES,
    RELATION_WORDS,
    article,
    background_phrase,
    bare_phrase,
    cardinal,
    chance,
    full_phrase,
    join,
    noun,
    noun_phrase,
    number,
    pick,
    shape_word,
    var,
    zone_phrase,
)
from aoq_train.datasets.synth.scenes import (
    PERTURBATIONS,
    STREAM_CAPTIONS,
    STREAM_CONTRAST,
    Scene,
    rng_for,
)

CAPTIONS_PER_IMAGE = 5

_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}

#: what a template returns: its text and the facts the text states.
_Said = tuple[str, Facts]


def _count(rng: random.Random, scene: Scene, detail: float) -> _Said:
    n = len(scene.objects)
    count = (f"count({n})",)
    if n == 1:
        noun1, (bg1, f1) = noun(rng, False), background_phrase(rng, scene)
        noun2 = noun(rng, False)
        noun3, (bg3, f3) = noun(rng, False), background_phrase(rng, scene)
        (bg4, f4), noun4 = background_phrase(rng, scene), noun(rng, False)
        return rng.choice(
            (
                (f"a single {noun1} on {bg1}", count + f1),
                (f"just one {noun2} in the picture", count),
                (f"only one {noun3} is visible on {bg3}", count + f3),
                (f"{bg4} with one {noun4}", count + f4),
            )
        )
    num, nouns = number(rng, n), noun(rng, True)
    bg1, f1 = background_phrase(rng, scene)
    what = pick(rng, ("image", "picture", "scene"))
    bg3, f3 = background_phrase(rng, scene)
    how = pick(rng, ("placed", "scattered", "arranged"))
    bg4, f4 = background_phrase(rng, scene)
    kind = pick(rng, ("picture", "scene", "drawing"))
    text, facts = rng.choice(
        (
            (f"{num} {nouns} on {bg1}", count + f1),
            (f"there are {num} {nouns} in this {what}", count),
            (f"{bg3} with {num} {nouns}", count + f3),
            (f"{num} {nouns} {how} on {bg4}", count + f4),
            (f"a {kind} showing {num} different {nouns}", count),
        )
    )
    if chance(rng, detail):
        named = rng.sample(scene.objects, 2 if chance(rng, detail) else 1)
        text += pick(rng, (", including ", ", among them "))
        said = [noun_phrase(rng, scene, o) for o in named]
        text += join([t for t, _ in said])
        facts += tuple(f for _, fs in said for f in fs)
    return text, facts


def _single(rng: random.Random, scene: Scene, detail: float) -> _Said:
    obj = rng.choice(scene.objects)
    prefix = pick(rng, PREFIXES)
    np_, facts = noun_phrase(rng, scene, obj)
    text = prefix + np_
    if chance(rng, 0.6):
        zone, zf = zone_phrase(rng, scene, obj)
        text += " " + zone
        facts += zf
    n = len(scene.objects)
    if n > 1 and chance(rng, detail):
        others = pick(rng, ("another", "one other")) if n == 2 else f"{cardinal(rng, n - 1)} other"
        text += pick(rng, (" among ", " and ", " with ")) + f"{others} {noun(rng, n > 2)}"
        facts += (f"count({n})",)
    elif n > 1 and chance(rng, 0.3):
        text += pick(rng, (" among other shapes", " and some other shapes", " with a few other objects"))
        facts += ("several",)
    return text, facts


def _relational(rng: random.Random, scene: Scene, detail: float) -> _Said:
    a, b = rng.sample(scene.objects, 2)
    rel = relation(a, b)
    words = pick(rng, RELATION_WORDS[rel])
    inverse = pick(rng, RELATION_WORDS[_INVERSE[rel]])
    (na, fa), (nb, fb) = (noun_phrase(rng, scene, a, p_size=0.3 + 0.3 * detail),
                          noun_phrase(rng, scene, b, p_size=0.3 + 0.3 * detail))
    verb = pick(rng, ("is", "sits", "is placed", "appears"))
    text = pick(
        rng,
        (
            f"{na} {words} {nb}",
            f"{na} {verb} {words} {nb}",
            f"{nb} {inverse} {na}",
            f"there is {nb} and {na} {words} it",
            f"{nb} with {na} {words} it",
        ),
    )
    facts = fa + fb + (relation_fact(rel, var(scene, a), var(scene, b)),)
    rest = len(scene.objects) - 2
    if rest and chance(rng, detail):
        text += pick(rng, (", and ", ", plus ")) + ("one more shape" if rest == 1 else f"{cardinal(rng, rest)} more shapes")
        facts += (f"count({len(scene.objects)})",)
    return text, facts


def _enumeration(rng: random.Random, scene: Scene, detail: float) -> _Said:
    p_size = 0.7 if chance(rng, detail) else 0.0
    said = [noun_phrase(rng, scene, obj, p_size=p_size, p_colour=0.95) for obj in rng.sample(scene.objects, len(scene.objects))]
    text = join([t for t, _ in said])
    if chance(rng, 0.3):
        text = pick(rng, ("a picture with ", "an image containing ", "this scene shows ")) + text
    # naming every object says there is nothing else
    return text, tuple(f for _, fs in said for f in fs) + (f"count({len(scene.objects)})",)


def _grouped(rng: random.Random, scene: Scene, detail: float) -> _Said:
    """Counts per colour or per shape: "two red shapes and a blue one", "two circles and a star"."""
    n = len(scene.objects)
    by_colour = chance(rng, 0.5)
    attribute = "colour" if by_colour else "shape"
    groups = Counter(o.colour if by_colour else o.shape for o in scene.objects)
    # every object is counted in its group, so the groups say what each object is and how many
    facts = tuple(f"{attribute}({var(scene, o)},{getattr(o, attribute)})" for o in scene.objects) + (f"count({n})",)
    if len(groups) == 1:
        (key,) = groups
        if by_colour:
            return pick(
                rng,
                (
                    f"{number(rng, n)} {noun(rng, True)}, all of them {pick(rng, COLOUR_WORDS[key])}",
                    f"{number(rng, n)} {pick(rng, COLOUR_WORDS[key])} {noun(rng, True)}",
                ),
            ), facts
        different = f"{number(rng, n)} {shape_word(rng, key, plural=True)} of different colors"
        plain = f"{number(rng, n)} {shape_word(rng, key, plural=True)}"
        text = pick(rng, (different, plain))
        if text is different:
            if len({o.colour for o in scene.objects}) == n:
                return text, facts + ("distinct_colours",)
            text = text.removesuffix(" of different colors")  # it would not be true
        return text, facts
    parts = []
    items = list(groups.items())
    for key, count in rng.sample(items, len(items)):
        if by_colour:
            thing = noun(rng, count > 1)
            colour = pick(rng, COLOUR_WORDS[key])
            parts.append(article(f"{colour} {thing}") if count == 1 else f"{number(rng, count)} {colour} {thing}")
        else:
            word = shape_word(rng, key, plural=count > 1)
            parts.append(article(word) if count == 1 else f"{number(rng, count)} {word}")
    return join(parts), facts


def _partial(rng: random.Random, scene: Scene, detail: float) -> _Said:
    """One object named, the others only counted."""
    n = len(scene.objects)
    obj = rng.choice(scene.objects)
    rest = n - 1
    others = "another shape" if rest == 1 else f"{cardinal(rng, rest)} other {noun(rng, True)}"
    num1, noun1, (np1, f1) = number(rng, n), noun(rng, True), noun_phrase(rng, scene, obj)
    num2, noun2, (np2, f2) = number(rng, n), noun(rng, True), noun_phrase(rng, scene, obj)
    np3, f3 = noun_phrase(rng, scene, obj)
    np4, f4 = noun_phrase(rng, scene, obj)
    text, facts = rng.choice(
        (
            (f"one of the {num1} {noun1} is {np1}", f1),
            (f"{num2} {noun2}, one of which is {np2}", f2),
            (f"{np3} and {others}", f3),
            (f"{np4} together with {others}", f4),
        )
    )
    return text, facts + (f"count({n})",)


def _sizes(rng: random.Random, scene: Scene, detail: float) -> _Said:
    """A size comparison between two objects of different size classes."""
    order = {"small": 0, "medium": 1, "large": 2}
    pairs = [
        (a, b) for a in scene.objects for b in scene.objects if order[a.size] > order[b.size]
    ]
    big, small = rng.choice(pairs)
    (nb, fb), (ns, fs) = noun_phrase(rng, scene, big, p_size=0.0), noun_phrase(rng, scene, small, p_size=0.0)
    bigger = (f"bigger({var(scene, big)},{var(scene, small)})",)
    largest = max(order[o.size] for o in scene.objects)
    word1 = pick(rng, ("bigger", "larger"))
    bare2, f2 = bare_phrase(rng, scene, small, p_size=0.0)
    word3 = pick(rng, ("bigger", "larger", "much larger"))
    bare3, f3 = bare_phrase(rng, scene, big, p_size=0.0)
    options = [
        (f"{nb} {word1} than {ns}", fb + fs + bigger),
        (f"{nb} and a smaller {bare2}", fb + f2 + bigger),
        (f"{ns} next to a {word3} {bare3}", fs + f3 + bigger),
    ]
    if order[big.size] == largest and sum(order[o.size] == largest for o in scene.objects) == 1:
        word4 = pick(rng, ("largest", "biggest"))
        options.append((f"the {word4} {noun(rng, False)} is {nb}", fb + (f"largest({var(scene, big)})",)))
    return rng.choice(options)


def _lone(rng: random.Random, scene: Scene, detail: float) -> _Said:
    """The only object of a one-object scene, placed and on its background."""
    obj = scene.objects[0]
    np_, f = noun_phrase(rng, scene, obj, p_size=0.8)
    zone1, z1 = zone_phrase(rng, scene, obj)
    bg1, b1 = background_phrase(rng, scene)
    bg2, b2 = background_phrase(rng, scene)
    zone2, z2 = zone_phrase(rng, scene, obj)
    bg3, b3 = background_phrase(rng, scene)
    return rng.choice(
        (
            (f"{np_} {zone1} of {bg1}", f + z1 + b1),
            (f"{bg2} with {np_} {zone2}", f + b2 + z2),
            (f"{np_} alone on {bg3}", f + b3 + ("count(1)",)),
        )
    )


_Template = Callable[[random.Random, Scene, float], _Said]


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
    if chance(rng, 0.5):
        text = text[0].upper() + text[1:]
    if chance(rng, 0.4):
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


def _caption(rng: random.Random, scene: Scene, template: _Template, detail: float) -> _Said:
    """One caption of ``template``, with the background added with probability ``detail``."""
    text, facts = template(rng, scene, detail)
    if not _mentions_background(text) and chance(rng, detail):
        background, more = background_phrase(rng, scene)
        text, facts = text + " on " + background, facts + more
    return text, facts


def _finish(rng: random.Random, said: _Said) -> Caption:
    return Caption(_style(rng, said[0]), tuple(sorted(set(said[1]))))


def caption_scene(scene: Scene, rng: random.Random, detail: float, n: int = CAPTIONS_PER_IMAGE) -> list[Caption]:
    """``n`` captions of ``scene``, each with the facts it states.

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
    captions: list[Caption] = []
    for template in order:
        said = _caption(rng, scene, template, detail)
        for _ in range(10):
            if said[0] not in seen:
                break
            said = _caption(rng, scene, template, detail)
        seen.add(said[0])
        captions.append(_finish(rng, said))
    return captions


#: draws of a contrastive caption before the image keeps its ordinary one.
_CONTRAST_TRIES = 20


def _contrast(rng: random.Random, scene: Scene, kind: str, changed: tuple[int, ...], detail: float) -> _Said:
    """A caption of ``scene`` that states its side of a ``kind`` change on objects ``changed``.

    colour / shape / size / position: the changed object with every attribute (and its place
    for position); relation: the two swapped objects, fully named, and where one is relative to
    the other; count: the number of objects (a count caption).
    """
    if kind == "count":
        return _count(rng, scene, detail)
    objs = [scene.objects[k] for k in changed]
    if kind == "relation":
        a, b = rng.sample(objs, 2)
        rel = relation(a, b)
        (na, fa), (nb, fb) = full_phrase(rng, scene, a), full_phrase(rng, scene, b)
        fact = (relation_fact(rel, var(scene, a), var(scene, b)),)
        if chance(rng, 0.5):
            return f"{na} {pick(rng, RELATION_WORDS[rel])} {nb}", fa + fb + fact
        return f"{nb} {pick(rng, RELATION_WORDS[_INVERSE[rel]])} {na}", fa + fb + fact
    obj = objs[0]
    text, facts = full_phrase(rng, scene, obj)
    text = pick(rng, PREFIXES) + text
    if kind == "position" or chance(rng, 0.5):
        zone, zf = zone_phrase(rng, scene, obj)
        text, facts = text + " " + zone, facts + zf
    return text, facts


def caption_family(scenes: Sequence[Scene], seed: int, split: str, first_index: int, detail: float,
                   contrast: int = 0) -> list[list[Caption]]:
    """Captions of a family's images (``scenes[0]`` its base), image ``first_index`` first.

    Each image gets :func:`caption_scene`'s captions. With ``contrast > 0`` and more than one
    image, its last ``contrast`` captions are replaced by captions that state what tells it
    apart from a sibling, kept only when their facts are false for that sibling: a variant
    states its own change (false for every sibling), the base states its side of one variant's
    change, variant after variant (false for that variant). A contrastive caption that cannot
    be made false after ``_CONTRAST_TRIES`` draws leaves the ordinary caption in place.
    """
    out = [
        caption_scene(scene, rng_for(seed, split, STREAM_CAPTIONS, first_index + k), detail)
        for k, scene in enumerate(scenes)
    ]
    if contrast == 0 or len(scenes) < 2:
        return out
    ground = [index_facts(scene_facts(s)) for s in scenes]
    for k, scene in enumerate(scenes):
        rng = rng_for(seed, split, STREAM_CONTRAST, first_index + k)
        for j in range(contrast):
            if k == 0:  # the base: its side of variant 1, 2, ... in turn
                target = 1 + j % (len(scenes) - 1)
                kind, changed, against = scenes[target].variant, scenes[target].changed, [target]
            else:
                kind, changed = scene.variant, scene.changed
                against = [m for m in range(len(scenes)) if m != k]
            if kind not in PERTURBATIONS:
                continue  # a sibling drawn as an independent scene: no one change to state
            texts = {c.text.lower().rstrip(".") for c in out[k]}
            for _ in range(_CONTRAST_TRIES):
                said = _caption(rng, scene, lambda r, s, d: _contrast(r, s, kind, changed, d), detail)
                query = [parse_fact(f) for f in set(said[1])]
                if said[0].lower() not in texts and not any(facts_hold(query, ground[m]) for m in against):
                    out[k][len(out[k]) - contrast + j] = _finish(rng, said)
                    break
    return out
