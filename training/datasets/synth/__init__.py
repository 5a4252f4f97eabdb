"""The synthetic benchmark: families of near-duplicate shape scenes, COCO-like captions, and
region features extracted from the rendered pixels (see docs/synthetic.md).

Modules: ``scenes`` (what is in a picture, families of variants), ``render`` (Pillow drawing),
``captions`` (five sentences per picture), ``features`` (the pixel region extractor the search
service also uses) and ``writer`` (both dataset layouts, in parallel, deterministically).
"""
