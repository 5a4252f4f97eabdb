"""Caption tokenizer and vocabulary, with no download (no NLTK data).

The tokenizer approximates what VSE++/SCAN/VSRN get from ``nltk.word_tokenize(text.lower())``
closely enough for retrieval, from a single regular expression:

- text is NFKC-normalised and lower-cased; typographic apostrophes become ``'``;
- a token is a run of letters/digits (any script), a decimal number (``3.5``), a number with
  thousands separators (``1,000``), or an English clitic split off its word the NLTK way
  (``man's`` -> ``man 's``, ``don't`` -> ``do n't``);
- punctuation, hyphens and quotes separate tokens and are dropped: they carry no retrieval
  signal in captions, and dropping them makes ``"surfboard."`` and ``"snow ."`` tokenise alike;
- but ``#``, ``*`` and every symbol character (Unicode categories Sm, Sc, Sk, So: ``+``, ``×``,
  ``$``, ``✓``...) are tokens of their own, because in names such as ``keycap: #`` /
  ``keycap: *`` or ``+1`` / ``−1`` they are the only words that tell two things apart.

A :class:`Vocabulary` maps tokens to ids with four reserved ids (``<pad>``=0, ``<start>``=1,
``<end>``=2, ``<unk>``=3). It is saved as JSON that records the tokenizer version, so a
vocabulary is never silently reused with a tokenizer that splits text differently.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from aoq.io import ArtefactError, atomic_write_json, parse_json

log = logging.getLogger(__name__)

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

#: bump whenever :func:`tokenize` changes what it returns; saved vocabularies record it.
TOKENIZER_VERSION = "aoq-regex-2"
_KIND = "aoq-vocabulary"

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_NEGATION = re.compile(r"(?<=[^\W_])n't\b")
# The last alternative takes any other single non-space character; _is_token keeps only symbols.
_TOKEN = re.compile(r"n't|'(?:s|re|ve|ll|d|m)\b|\d{1,3}(?:,\d{3})+\b|\d+(?:\.\d+)+|[^\W_]+|[^\w\s]")
_KEPT_PUNCTUATION = frozenset("#*")


def tokenize(text: str) -> list[str]:
    """Split a caption into lower-case word tokens (see the module docstring for the rules).

    >>> tokenize("A man's board, isn't it?")
    ['a', 'man', "'s", 'board', 'is', "n't", 'it']
    """
    text = unicodedata.normalize("NFKC", text).lower().translate(_APOSTROPHES)
    # "isn't" -> "is n't": otherwise the letter run would swallow the "n" of "n't".
    text = _NEGATION.sub(" n't", text)
    return [t for t in _TOKEN.findall(text) if _is_token(t)]


def _is_token(token: str) -> bool:
    """False only for a lone punctuation character (other than ``#`` and ``*``)."""
    if len(token) > 1 or token.isalnum() or token in _KEPT_PUNCTUATION:
        return True
    return unicodedata.category(token).startswith("S")


def coverage(vocab: "Vocabulary", captions: Iterable[str]) -> dict[str, float | int]:
    """How much of ``captions`` the vocabulary covers.

    Returns:
        ``tokens`` and ``unknown_tokens`` (mapped to ``<unk>``), ``captions`` and
        ``unknown_captions`` (captions none of whose tokens is known, including captions with no
        token at all: the text encoder sees nothing of them), and the two shares in [0, 1].
    """
    n_tokens = n_unknown = n_captions = n_blind = 0
    for caption in captions:
        tokens = tokenize(caption)
        unknown = sum(t not in vocab for t in tokens)
        n_tokens += len(tokens)
        n_unknown += unknown
        n_captions += 1
        n_blind += unknown == len(tokens)
    return {
        "tokens": n_tokens,
        "unknown_tokens": n_unknown,
        "unknown_token_share": n_unknown / n_tokens if n_tokens else 0.0,
        "captions": n_captions,
        "unknown_captions": n_blind,
        "unknown_caption_share": n_blind / n_captions if n_captions else 0.0,
    }


def format_coverage(cov: dict[str, float | int]) -> str:
    """One line: ``3.10% of 5000 caption tokens unknown; 0.40% of 1000 captions entirely unknown``."""
    return (
        f"{100 * cov['unknown_token_share']:.2f}% of {cov['tokens']} caption tokens unknown; "
        f"{100 * cov['unknown_caption_share']:.2f}% of {cov['captions']} captions entirely unknown"
    )


class Vocabulary:
    """Token <-> id mapping with the four reserved ids first.

    Attributes:
        words: id -> token; ``words[:4]`` are the special tokens.
        threshold: the minimum train-split frequency a word needed (recorded for provenance).
    """

    def __init__(self, words: Sequence[str], threshold: int = 1) -> None:
        self.words: list[str] = list(words)
        self.threshold = int(threshold)
        self._index: dict[str, int] = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, captions: Iterable[str], threshold: int = 4) -> "Vocabulary":
        """Vocabulary of every token seen at least ``threshold`` times in ``captions``.

        Words are ordered by decreasing frequency, ties alphabetically, so the ids do not depend
        on the order of the captions.
        """
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        counts: Counter[str] = Counter()
        for caption in captions:
            counts.update(tokenize(caption))
        kept = sorted((w for w, n in counts.items() if n >= threshold and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        total = sum(counts.values())
        dropped = total - sum(counts[w] for w in kept)
        log.info(
            "vocabulary: %d words seen %d+ times (of %d distinct); %.2f%% of the %d training tokens "
            "fall below the threshold and become <unk>",
            len(kept), threshold, len(counts), 100 * dropped / total if total else 0.0, total,
        )
        return cls([*SPECIALS, *kept], threshold)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens, threshold={self.threshold})"

    def token_id(self, token: str) -> int:
        """Id of a token, ``<unk>``'s id when it is not in the vocabulary."""
        return self._index.get(token, UNK_ID)

    def encode(self, text: str) -> list[int]:
        """``<start>``, the ids of ``tokenize(text)``, ``<end>``."""
        return [START_ID, *(self._index.get(t, UNK_ID) for t in tokenize(text)), END_ID]

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens joined by spaces; padding, start and end tokens are left out."""
        return " ".join(self.words[int(i)] for i in ids if int(i) not in (PAD_ID, START_ID, END_ID))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (stored on its own and inside checkpoints)."""
        return {
            "kind": _KIND,
            "tokenizer": TOKENIZER_VERSION,
            "threshold": self.threshold,
            "words": list(self.words),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "vocabulary") -> "Vocabulary":
        """Rebuild from :meth:`to_dict` output, checking it first.

        Raises:
            ArtefactError: naming ``source`` and what is wrong (foreign file, other tokenizer,
                missing/duplicate/misplaced words).
        """
        if not isinstance(data, dict) or data.get("kind") != _KIND:
            raise ArtefactError(f"{source}: not an AOQ vocabulary (expected \"kind\": \"{_KIND}\")")
        if data.get("tokenizer") != TOKENIZER_VERSION:
            raise ArtefactError(
                f"{source}: built with tokenizer {data.get('tokenizer')!r}, this code uses "
                f"{TOKENIZER_VERSION!r}; rebuild it with `aoq vocab`"
            )
        words = data.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise ArtefactError(f"{source}: \"words\" must be a list of non-empty strings")
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ArtefactError(f"{source}: the first words must be {list(SPECIALS)}, got {words[:4]}")
        if len(set(words)) != len(words):
            dupes = sorted(w for w, n in Counter(words).items() if n > 1)
            raise ArtefactError(f"{source}: duplicate words {dupes[:5]}")
        threshold = data.get("threshold", 1)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise ArtefactError(f"{source}: \"threshold\" must be a positive integer, got {threshold!r}")
        return cls(words, threshold)

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary as JSON atomically."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        """Read a vocabulary written by :meth:`save`.

        Raises:
            ArtefactError: the file is missing, not UTF-8 JSON, or not a valid vocabulary.
        """
        path = Path(path)
        if not path.is_file():
            raise ArtefactError(f"{path}: vocabulary file not found")
        data = parse_json(path, what="vocabulary")
        return cls.from_dict(data, source=str(path))
