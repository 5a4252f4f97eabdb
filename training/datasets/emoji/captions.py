"""The five captions of an emoji picture: a fixed rule over the Unicode/CLDR words, no hand-written
or generated text. Both vendors' pictures of one emoji get the same five captions.

1. the CLDR short name: ``thumbs up: dark skin tone``;
2. the Unicode names of its code points (joiners, variation selectors and tag characters left
   out), lower-cased and joined by ``", "``: ``thumbs up sign, emoji modifier fitzpatrick type-6``;
3. the CLDR keywords in CLDR order, joined by ``", "``: ``+1, dark skin tone, hand, thumb, thumbs
   up, up`` (the short name when CLDR has none);
4. the short name and the emoji-test subgroup (hyphens as spaces): ``thumbs up: dark skin tone,
   hand fingers closed``;
5. the emoji-test group, lower-cased, and the short name: ``people & body: thumbs up: dark skin
   tone``.
"""

from __future__ import annotations

from aoq_train.datasets.emoji.catalogue import Emoji

CAPTIONS_PER_IMAGE = 5


def emoji_captions(emoji: Emoji) -> list[str]:
    """The five captions of ``emoji`` (rule in the module docstring); never empty, one line each."""
    captions = [
        emoji.name,
        ", ".join(emoji.unicode_names) or emoji.name,
        ", ".join(emoji.keywords),
        f"{emoji.name}, {emoji.subgroup.replace('-', ' ')}",
        f"{emoji.group.lower()}: {emoji.name}",
    ]
    # One caption per line in the precomp layout: no line breaks may survive.
    return [" ".join(c.split()) for c in captions]
