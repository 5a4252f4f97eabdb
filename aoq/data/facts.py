"""Structured facts of images and captions, and the test "is this caption true of that image".

A *fact* is an atom written ``pred(arg, ...)`` or a bare ``pred`` (``count(3)``,
``colour(?0,red)``, ``left(?0,?1)``, ``several``). An image carries **ground** facts: every
argument is a constant (``colour(2,red)``: object 2 is red). A caption carries the facts it
states; an argument starting with ``?`` is a variable standing for an object of the picture.
Different variables name different objects ("a red circle and a red circle" needs two).

A caption is **true of** an image when its facts, with every variable bound to a distinct
constant, are all among the image's facts (:func:`facts_hold`). Without variables this is plain
set containment: the image's facts include the caption's. That is what lets round-2 sampling
recognise a mined caption that also describes the anchor (a false negative) mechanically.
A caption with no facts is never taken to be true of another image.

Optional data, read beside a split (``SplitData.facts``, None when absent):

- precomp: ``{split}_facts.jsonl``, one line per image, in image order:
  ``{"facts": [fact, ...], "captions": [[fact, ...] per caption], "family": int, "change": str}``;
  ``family`` (groups of near-duplicate images) and ``change`` (how an image differs from its
  group's base) are optional, on every line or none;
- Karpathy JSON: each image entry's ``"facts"``, ``"family"``, ``"change"`` and each sentence's
  ``"facts"`` (every entry or none).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aoq.data.dataset import DataError

Atom = tuple[str, tuple[str, ...]]


class FactError(DataError):
    """A fact string that is not ``pred`` or ``pred(arg, ...)``, or a bad facts file."""


def parse_fact(text: str) -> Atom:
    """``"left(?0,?1)"`` -> ``("left", ("?0", "?1"))``; ``"several"`` -> ``("several", ())``."""
    text = text.strip()
    if "(" not in text:
        if not text or ")" in text or "," in text:
            raise FactError(f"bad fact {text!r}: expected pred or pred(arg, ...)")
        return text, ()
    pred, _, rest = text.partition("(")
    if not pred or not rest.endswith(")") or "(" in rest:
        raise FactError(f"bad fact {text!r}: expected pred or pred(arg, ...)")
    args = tuple(a.strip() for a in rest[:-1].split(","))
    if any(not a for a in args):
        raise FactError(f"bad fact {text!r}: empty argument")
    return pred, args


def _bind(query: list[Atom], index: dict[str, list[tuple[str, ...]]], binding: dict[str, str]) -> bool:
    """Backtracking search for an injective binding of the variables that makes every atom true."""
    if not query:
        return True
    (pred, args), rest = query[0], query[1:]
    for ground in index.get(pred, ()):
        if len(ground) != len(args):
            continue
        new: dict[str, str] = {}
        ok = True
        for a, g in zip(args, ground):
            if not a.startswith("?"):
                ok = a == g
            elif a in binding or a in new:
                ok = (binding[a] if a in binding else new[a]) == g
            else:  # a fresh variable takes a constant no other variable holds
                ok = g not in binding.values() and g not in new.values()
                new[a] = g
            if not ok:
                break
        if ok and _bind(rest, index, {**binding, **new}):
            return True
    return False


def facts_hold(caption: Sequence[Atom], image: dict[str, list[tuple[str, ...]]]) -> bool:
    """Whether every fact of ``caption`` holds in ``image`` (module doc), variables bound injectively.

    Args:
        caption: parsed caption facts (:func:`parse_fact`).
        image: the image's ground facts indexed by predicate (:func:`index_facts`).
    """
    # Atoms with more arguments constrain most: trying them first keeps the search tiny.
    return _bind(sorted(caption, key=lambda atom: -len(atom[1])), image, {})


def index_facts(facts: Sequence[str]) -> dict[str, list[tuple[str, ...]]]:
    """Ground facts of an image grouped by predicate, the form :func:`facts_hold` reads.

    Raises:
        FactError: a fact is malformed or holds a variable.
    """
    index: dict[str, list[tuple[str, ...]]] = {}
    for text in facts:
        pred, args = parse_fact(text)
        if any(a.startswith("?") for a in args):
            raise FactError(f"image fact {text!r} holds a variable; image facts must be ground")
        index.setdefault(pred, []).append(args)
    return index


@dataclass
class SplitFacts:
    """Facts of one split, aligned with its images and captions (image by image).

    Attributes:
        images: ground facts per image.
        captions: facts per caption (``captions_per_image`` per image, image order).
        family: group id per image (near-duplicates share one), or None.
        change: per image, how it differs from its family's base (``"base"``, ``"single"``,
            ``"colour"``, ...), or None.
    """

    images: list[list[str]]
    captions: list[list[str]]
    family: np.ndarray | None = None
    change: list[str] | None = None

    def __post_init__(self) -> None:
        self._images: list[dict[str, list[tuple[str, ...]]] | None] = [None] * len(self.images)
        self._captions: list[list[Atom] | None] = [None] * len(self.captions)

    def subset(self, n_images: int, captions_per_image: int) -> "SplitFacts":
        """The facts of the first ``n_images`` images and their captions."""
        return SplitFacts(
            self.images[:n_images],
            self.captions[: n_images * captions_per_image],
            None if self.family is None else self.family[:n_images],
            None if self.change is None else self.change[:n_images],
        )

    def caption_true_of(self, captions: np.ndarray, images: np.ndarray) -> np.ndarray:
        """Element-wise: does caption ``captions[k]`` hold of image ``images[k]``? (bool array).

        A caption without facts is never judged true of another image: nothing is known
        about it, and the filter this serves must never drop a true negative. Facts are parsed on
        first use and kept, so repeated epochs pay for parsing once.
        """
        captions = np.asarray(captions, dtype=np.int64).reshape(-1)
        images = np.asarray(images, dtype=np.int64).reshape(-1)
        out = np.zeros(captions.size, dtype=bool)
        for k, (c, i) in enumerate(zip(captions.tolist(), images.tolist())):
            query = self._captions[c]
            if query is None:
                query = self._captions[c] = [parse_fact(f) for f in self.captions[c]]
            image = self._images[i]
            if image is None:
                image = self._images[i] = index_facts(self.images[i])
            out[k] = bool(query) and facts_hold(query, image)
        return out


def check_facts(facts: SplitFacts, n_images: int, captions_per_image: int, where: str) -> SplitFacts:
    """Check lengths and types against the split; returns ``facts``.

    Raises:
        FactError: a length or type mismatch, naming ``where``.
    """
    def fact_lists(value: object) -> bool:
        return isinstance(value, list) and all(
            isinstance(item, list) and all(isinstance(f, str) and f for f in item) for item in value
        )

    if not fact_lists(facts.images) or not fact_lists(facts.captions):
        raise FactError(f"{where}: facts must be lists of non-empty strings per image and per caption")
    if len(facts.images) != n_images or len(facts.captions) != n_images * captions_per_image:
        raise FactError(
            f"{where}: facts for {len(facts.images)} images and {len(facts.captions)} captions, "
            f"the split has {n_images} images x {captions_per_image} captions"
        )
    if facts.family is not None and len(facts.family) != n_images:
        raise FactError(f"{where}: {len(facts.family)} family ids for {n_images} images")
    if facts.change is not None and len(facts.change) != n_images:
        raise FactError(f"{where}: {len(facts.change)} change kinds for {n_images} images")
    return facts


def read_facts_file(path: Path, n_images: int, captions_per_image: int) -> SplitFacts | None:
    """``{split}_facts.jsonl`` of a precomp folder (module doc), None when the file is absent.

    Raises:
        FactError: a line that is not valid JSON or lacks its keys, or facts that do not fit the split.
    """
    if not path.is_file():
        return None
    images, captions, family, change = [], [], [], []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FactError(f"{path}: line {number} is not valid JSON ({exc})") from None
            if not isinstance(record, dict) or "facts" not in record or "captions" not in record:
                raise FactError(f'{path}: line {number} needs "facts" and "captions"')
            images.append(record["facts"])
            captions.extend(record["captions"] if isinstance(record["captions"], list) else [None])
            family.append(record.get("family"))
            change.append(record.get("change"))
    facts = SplitFacts(
        images,
        captions,
        None if None in family else np.asarray(family, dtype=np.int64),
        None if None in change else change,
    )
    return check_facts(facts, n_images, captions_per_image, str(path))


def normalised_text(text: str) -> str:
    """A caption's text for identity tests: case and white space folded."""
    return " ".join(text.lower().split())


def text_identity(captions: list[str], captions_per_image: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Element-wise "caption ``c`` is true of image ``i``" by text identity alone: ``c``'s text is
    one of ``i``'s own captions. Always a *certain* false negative (a dataset whose pictures share
    caption text, like emoji variants sharing CLDR keywords, has many); no facts needed."""
    ids = {t: k for k, t in enumerate(dict.fromkeys(normalised_text(c) for c in captions))}
    text_id = np.array([ids[normalised_text(c)] for c in captions], dtype=np.int64)
    own = text_id.reshape(-1, captions_per_image)

    def true_of(caps: np.ndarray, images: np.ndarray) -> np.ndarray:
        caps = np.asarray(caps, dtype=np.int64).reshape(-1)
        images = np.asarray(images, dtype=np.int64).reshape(-1)
        return (text_id[caps][:, None] == own[images]).any(axis=1)

    return true_of
