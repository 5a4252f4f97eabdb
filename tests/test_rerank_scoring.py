"""A re-ranker's query scoring (aoq.pair_scores.score_sentence / score_image): the scores of a
shortlist equal those of the whole score matrix restricted to it (to float32 rounding), and the
gallery's precomputed region terms change no bit of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aoq.config import ModelConfig
from aoq.embed import EncodedFragments
from aoq.models.attention import Fragments, region_stats
from aoq.models.joint import build_model
from aoq.pair_scores import score_image, score_sentence
from aoq_serve.index.rerank import STATS_BLOCK, gallery_region_stats

G, R, D = STATS_BLOCK + 9, 5, 16  # more images than one block of region terms
CPU = torch.device("cpu")


def _model(kind: str, preset: str = "t2i_lse"):
    torch.manual_seed(0)
    cfg = ModelConfig(image_encoder=kind, embed_dim=D, word_dim=8, scan_preset=preset)
    return build_model(cfg, 30, 12).eval()


def _gallery() -> EncodedFragments:
    rng = np.random.default_rng(1)
    regions = rng.standard_normal((G, R, D), dtype=np.float32)
    regions /= np.linalg.norm(regions, axis=2, keepdims=True)
    lengths = rng.integers(1, 7, 2 * G)
    words = rng.standard_normal((int(lengths.sum()), D), dtype=np.float32)
    return EncodedFragments(regions, words / np.linalg.norm(words, axis=1, keepdims=True),
                            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


@pytest.mark.parametrize(("kind", "preset"), [("bfan", "t2i_lse"), ("scan", "t2i_lse"), ("scan", "i2t_avg")])
def test_a_sentence_against_a_shortlist_equals_the_full_scores_restricted(kind, preset):
    model, gallery = _model(kind, preset), _gallery()
    words = gallery.words[gallery.offsets[3] : gallery.offsets[4]]
    short = np.array([G - 1, 0, 17, STATS_BLOCK, 5])
    with torch.inference_mode():
        full = model.pair_scores(torch.from_numpy(gallery.regions), torch.from_numpy(words)[None],
                                 torch.tensor([len(words)]))[:, 0].numpy()
    stored = gallery_region_stats(gallery.regions)
    with_terms = score_sentence(model.pair_scores, words, gallery.regions, short, CPU, stored)
    assert np.array_equal(with_terms, score_sentence(model.pair_scores, words, gallery.regions, short, CPU))
    # a batch of another size may round its products differently (one float32 ulp here)
    np.testing.assert_allclose(with_terms, full[short], rtol=0, atol=1e-6)


def test_an_image_against_a_shortlist_of_captions_equals_the_full_scores_restricted():
    model, gallery = _model("bfan"), _gallery()
    short = np.array([2 * G - 1, 4, 0, 33])
    with torch.inference_mode():
        words, lengths = gallery.captions(range(gallery.n_captions))
        full = model.pair_scores(torch.from_numpy(gallery.regions[7:8]), words, lengths)[0].numpy()
    np.testing.assert_allclose(score_image(model.pair_scores, gallery.regions[7], gallery, short, CPU), full[short],
                               rtol=0, atol=1e-6)


def test_region_terms_are_those_the_scoring_computes_and_need_every_region_valid():
    gallery = _gallery()
    gram, sq = gallery_region_stats(gallery.regions)
    expected = region_stats(torch.from_numpy(gallery.regions))
    assert gram.shape == (G, R, R) and sq.shape == (G, R)
    assert np.array_equal(gram, expected[0].numpy()) and np.array_equal(sq, expected[1].numpy())
    images = torch.from_numpy(gallery.regions[:2])
    with pytest.raises(ValueError, match="precomputed region stats are for images whose every region is valid"):
        Fragments(images, torch.tensor([R, R]), images, torch.tensor([R, R]), stats=region_stats(images))
