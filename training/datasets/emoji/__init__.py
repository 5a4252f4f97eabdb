"""The emoji dataset: Noto Color Emoji and Twemoji artwork paired with Unicode CLDR annotations
and Unicode character names (see docs/emoji.md).

Modules: ``sources`` (where the packaged inputs live, clear errors when one is missing),
``catalogue`` (the emoji list, names, keywords, groups and base emoji), ``captions`` (the
five-caption rule), ``render`` (both vendors' pictures as fixed-size RGB) and ``builder``
(drops, splits and the atomic, byte-reproducible writing of the dataset).
"""

from aoq_train.datasets.emoji.builder import build_emoji_dataset

__all__ = ["build_emoji_dataset"]
