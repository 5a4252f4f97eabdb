"""The synthetic benchmark: deterministic files in both layouts, pixel-derived region features,
varied non-exhaustive captions, families of one-change near-duplicates, robust extractor."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from aoq_cli.main import main
from aoq.data.facts import facts_hold, index_facts, parse_fact
from aoq.data.karpathy import read_karpathy
from aoq.data.precomp import read_precomp
from aoq.features import FEATURE_DIM, N_REGIONS, extract_regions
from aoq.io import file_hashes, read_manifest
from aoq_train.datasets.synth import writer
from aoq_train.datasets.synth.captions import caption_family, caption_scene
from aoq_train.datasets.synth.facts import scene_facts
from aoq_train.datasets.synth.render import render_scene
from aoq_train.datasets.synth.scenes import (
    COLOURS,
    STREAM_CAPTIONS,
    STREAM_RENDER,
    Scene,
    SceneObject,
    SceneParams,
    family_plan,
    rng_for,
    sample_family,
)
from aoq_train.report.family import within_family
from tests.fixtures import synth_scenes

SIZES = {"train": 12, "dev": 4, "test": 4}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "data"
    writer.write_dataset(out, SIZES, seed=3, workers=1, progress=False)
    return out


def test_same_arguments_give_byte_identical_files_whatever_the_worker_count(dataset, tmp_path):
    again = tmp_path / "again"
    writer.write_dataset(again, SIZES, seed=3, workers=2, progress=False)
    first, second = file_hashes(dataset), file_hashes(again)
    assert len(first) == 20 + 12 + 2  # PNGs, precomp files (+ labels, facts), Karpathy JSON, scenes.jsonl
    assert first == second
    assert (dataset / "manifest.json").read_bytes() == (again / "manifest.json").read_bytes()
    other = tmp_path / "other_seed"
    writer.write_dataset(other, SIZES, seed=4, workers=1, progress=False)
    assert file_hashes(other)["precomp/train_caps.txt"] != first["precomp/train_caps.txt"]


def test_both_layouts_hold_the_same_images_and_captions(dataset):
    manifest = read_manifest(dataset, kind="synthetic_dataset")
    assert manifest["config"]["sizes"] == SIZES
    assert manifest["n_regions"] == N_REGIONS and manifest["feature_dim"] == FEATURE_DIM
    karpathy = json.loads((dataset / "dataset_synth.json").read_text())
    assert karpathy["dataset"] == "synth"
    images = karpathy["images"]
    assert Counter(im["split"] for im in images) == {"train": 12, "val": 4, "test": 4}
    assert [im["imgid"] for im in images] == list(range(20))
    assert [s for im in images for s in im["sentids"]] == list(range(100))
    scenes = [json.loads(line) for line in (dataset / "scenes.jsonl").read_text().splitlines()]
    assert len(scenes) == 20
    for split, kname in writer.SPLITS.items():
        entries = [im for im in images if im["split"] == kname]
        feats = np.load(dataset / "precomp" / f"{split}_ims.npy", mmap_mode="r")
        assert feats.shape == (SIZES[split], N_REGIONS, FEATURE_DIM) and feats.dtype == np.float32
        caps = (dataset / "precomp" / f"{split}_caps.txt").read_text().split("\n")
        assert caps[-1] == "" and len(caps) - 1 == 5 * SIZES[split]
        assert caps[:-1] == [s["raw"] for im in entries for s in im["sentences"]]
        for im in entries:
            assert im["filepath"] == f"images/{kname}"
            assert (dataset / im["filepath"] / im["filename"]).is_file()
            assert all(s["imgid"] == im["imgid"] and s["tokens"] for s in im["sentences"])
        split_scenes = [s for s in scenes if s["split"] == split]
        assert [s["filename"] for s in split_scenes] == [im["filename"] for im in entries]
        assert [s["index"] for s in split_scenes] == list(range(SIZES[split]))


def test_features_are_computed_from_the_png_pixels(dataset):
    entries = json.loads((dataset / "dataset_synth.json").read_text())["images"]
    feats = np.load(dataset / "precomp" / "train_ims.npy")
    for k, im in enumerate(e for e in entries if e["split"] == "train"):
        with Image.open(dataset / im["filepath"] / im["filename"]) as png:
            np.testing.assert_array_equal(extract_regions(png), feats[k])


def test_other_image_sizes_are_featurised_at_the_extractor_size(tmp_path):
    out = tmp_path / "big"
    writer.write_dataset(out, {"train": 2, "dev": 1, "test": 1}, params=SceneParams(image_size=96), progress=False)
    feats = np.load(out / "precomp" / "test_ims.npy")
    with Image.open(out / "images" / "test" / writer.image_filename("test", 0)) as png:
        assert png.size == (96, 96)
        np.testing.assert_array_equal(extract_regions(png), feats[0])


def test_families_hold_one_change_variants():
    params = SceneParams(family_share=1.0)
    scenes = synth_scenes(params, 120)
    kinds = Counter()
    attrs = ("shape", "colour", "size")
    for variant in (s for s in scenes if s.variant not in ("base", "single")):
        base = next(b for b in scenes if b.family == variant.family and b.variant == "base")
        kinds[variant.variant] += 1
        assert variant.background == base.background and variant.signature() != base.signature()
        if variant.variant in attrs:
            assert len(variant.objects) == len(base.objects)
            changed = [(a, b) for a, b in zip(base.objects, variant.objects) if a != b]
            assert len(changed) == 1
            a, b = changed[0]
            assert [k for k in attrs if getattr(a, k) != getattr(b, k)] == [variant.variant]
            assert (a.x, a.y) == (b.x, b.y)
        elif variant.variant == "count":
            assert abs(len(variant.objects) - len(base.objects)) == 1
        elif variant.variant == "relation":
            def look(s):
                return sorted((o.shape, o.colour, o.size) for o in s.objects)

            assert look(variant) == look(base)
            assert sorted((o.x, o.y) for o in variant.objects) == sorted((o.x, o.y) for o in base.objects)
    assert set(kinds) == {"colour", "shape", "size", "count", "relation", "position"}


def test_family_share_knob_controls_near_duplicates():
    none = synth_scenes(SceneParams(family_share=0.0), 200)
    assert {s.variant for s in none} == {"single"}
    share = np.mean([s.variant != "single" for s in synth_scenes(SceneParams(family_share=0.5), 2000)])
    assert 0.4 < share < 0.6


def test_a_small_test_split_is_the_prefix_of_a_large_one():
    params = SceneParams()
    small, large = family_plan(1000, params, 0, "test"), family_plan(5000, params, 0, "test")
    assert small[:-1] == large[: len(small) - 1]
    assert sum(size for _, size in small) == 1000 and sum(size for _, size in large) == 5000


def test_captions_vary_and_mention_counts_attributes_and_relations():
    params = SceneParams()
    scenes = synth_scenes(params, 300)
    captions = [
        caption_scene(s, rng_for(0, "train", STREAM_CAPTIONS, k), params.caption_detail) for k, s in enumerate(scenes)
    ]
    assert all(len(c) == 5 for c in captions)
    flat = [c.text.lower() for cs in captions for c in cs]
    assert len(set(flat)) > 0.95 * len(flat)
    assert len({" ".join(c.split()[:3]) for c in flat}) > 100, "many different openings"
    joined = " ".join(flat)
    for phrase in ("two", "three", "four", "left of", "right of", "above", "below", "small", "large", "corner"):
        assert phrase in joined, phrase
    # Not exhaustive: in multi-object scenes some captions name fewer colours than there are.
    colour_words = re.compile("|".join(COLOURS))
    partial = sum(
        len(set(colour_words.findall(c.text.lower()))) < len({o.colour for o in s.objects})
        for s, cs in zip(scenes, captions)
        if len({o.colour for o in s.objects}) > 1
        for c in cs
    )
    assert partial > 0.3 * sum(5 for s in scenes if len({o.colour for o in s.objects}) > 1)


def test_caption_detail_knob_makes_captions_more_specific():
    scenes = synth_scenes(SceneParams(), 300)
    colour_words = re.compile(r"\b(" + "|".join(COLOURS) + r")\b")

    def stats(detail):
        caps = [
            c.text.lower()
            for k, s in enumerate(scenes)
            for c in caption_scene(s, rng_for(0, "train", STREAM_CAPTIONS, k), detail)
        ]
        background = np.mean([bool(re.search(r"background|backdrop|surface", c)) for c in caps])
        return background, np.mean([len(colour_words.findall(c)) for c in caps])

    (bg_low, colours_low), (bg_high, colours_high) = stats(0.0), stats(1.0)
    assert bg_high > bg_low + 0.4
    assert colours_high > colours_low + 0.15


def test_colour_variant_changes_the_features():
    params = SceneParams(family_share=1.0)
    scenes = synth_scenes(params, 100)
    k = next(i for i, s in enumerate(scenes) if s.variant == "colour")
    base = next(s for s in scenes if s.family == scenes[k].family and s.variant == "base")
    rng = rng_for(0, "train", STREAM_RENDER, 0)
    f_base = extract_regions(render_scene(base, replace(params, noise=0.0), rng))
    f_var = extract_regions(render_scene(scenes[k], replace(params, noise=0.0), rng))
    assert not np.array_equal(f_base, f_var)


def test_failed_generation_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def flaky(chunk):
        calls.append(chunk)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(chunk)

    real = writer._render_chunk
    monkeypatch.setattr(writer, "_render_chunk", flaky)
    monkeypatch.setattr(writer, "_CHUNK_IMAGES", 4)
    with pytest.raises(RuntimeError, match="disk full"):
        writer.write_dataset(tmp_path / "data", {"train": 12, "dev": 1, "test": 1}, workers=1, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_a_dataset_and_refuses_to_replace_foreign_folders(tmp_path, capsys):
    out = tmp_path / "synth"
    sizes = ["--train", "3", "--dev", "1", "--test", "1"]
    args = ["synth", "--out", str(out), *sizes, "--workers", "1", "--no-progress"]
    assert main(args) == 0
    assert "wrote 5 images" in capsys.readouterr().out
    assert main(args) == 0, "an earlier synthetic dataset is replaced"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["synth", "--out", str(foreign), *sizes, "--no-progress"]) == 2
    assert "refusing to replace" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train", "-3"], "argument --train: must be >= 1, got -3"),
        (["--test", "0"], "argument --test: must be >= 1, got 0"),
        (["--dev", "many"], "argument --dev: expected an integer, got 'many'"),
        (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    ],
)
def test_cli_rejects_bad_sizes_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["synth", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_rejects_bad_knobs_with_a_clear_message(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "x"), "--shapes", "12"]) == 2
    assert "n_shapes must be in 2..8, got 12" in capsys.readouterr().err
    assert main(["synth", "--out", str(tmp_path / "x"), "--caption-detail", "1.5"]) == 2
    assert "caption_detail must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert main(["synth", "--out", str(tmp_path / "x"), "--contrast-captions", "6"]) == 2
    assert "contrast_captions must be in 0..5, got 6" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_labels_are_the_object_classes_in_both_layouts(dataset):
    scenes = [json.loads(line) for line in (dataset / "scenes.jsonl").read_text().splitlines()]
    train = [s for s in scenes if s["split"] == "train"]
    expected = [sorted({f"shape:{o['shape']}" for o in s["objects"]}) for s in sorted(train, key=lambda s: s["index"])]
    assert json.loads((dataset / "precomp" / "train_labels.json").read_text()) == expected
    assert read_precomp(dataset / "precomp", "train").labels == expected
    karpathy = read_karpathy(dataset / "dataset_synth.json").split("train")
    assert karpathy.labels == expected and all(expected)


def _holds(facts, scene) -> bool:
    return facts_hold([parse_fact(f) for f in facts], index_facts(scene_facts(scene)))


def test_facts_are_written_and_readable_in_both_layouts(dataset):
    scenes = [json.loads(line) for line in (dataset / "scenes.jsonl").read_text().splitlines()]
    for split in writer.SPLITS:
        rows = sorted((s for s in scenes if s["split"] == split), key=lambda s: s["index"])
        facts = read_precomp(dataset / "precomp", split).facts
        assert facts.images == [s["facts"] for s in rows]
        assert facts.captions == [f for s in rows for f in s["caption_facts"]]
        assert facts.family.tolist() == [s["family"] for s in rows]
        assert facts.change == [s["variant"] for s in rows]
        karpathy = read_karpathy(dataset / "dataset_synth.json").split(split).facts
        assert (karpathy.images, karpathy.captions, karpathy.change) == (facts.images, facts.captions, facts.change)
        assert karpathy.family.tolist() == facts.family.tolist()
        # every caption is true of its own image, by its facts
        n = len(rows)
        assert facts.caption_true_of(np.arange(5 * n), np.arange(5 * n) // 5).all()
        assert all(facts.captions) and all(facts.images)
    assert read_precomp(dataset / "precomp", "train").subset(3).facts.captions == facts_of_first(dataset, 3)


def facts_of_first(dataset, n):
    return [f for line in (dataset / "scenes.jsonl").read_text().splitlines()[:n]
            for f in json.loads(line)["caption_facts"]]


def test_scene_facts_are_exact_for_a_hand_built_scene():
    red = SceneObject("circle", "red", "large", 0.2, 0.5, 0.17, (220, 40, 40))
    blue = SceneObject("square", "blue", "small", 0.8, 0.4, 0.07, (40, 80, 225))
    scene = Scene("white", "plain", (red, blue), 0, "single")
    assert scene_facts(scene) == [
        "count(2)", "bg(white)", "texture(plain)", "several",
        "shape(0,circle)", "colour(0,red)", "size(0,large)", "zone(0,left)",
        "shape(1,square)", "colour(1,blue)", "size(1,small)", "zone(1,right)",
        "left(0,1)", "bigger(0,1)", "largest(0)", "distinct_colours",
    ]
    assert _holds(["colour(?0,red)", "left(?0,?1)", "shape(?1,square)"], scene)
    assert not _holds(["colour(?0,red)", "left(?1,?0)"], scene)  # "a red shape right of something"
    assert not _holds(["colour(?0,red)", "colour(?1,red)"], scene)  # two red objects: variables are distinct
    assert not _holds(["count(3)"], scene)


_COLOUR_SYNONYMS = {"golden": "yellow", "violet": "purple", "rosy": "pink", "turquoise": "cyan", "teal": "cyan",
                    "chocolate": "brown", **{c: c for c in COLOURS}}


def test_caption_facts_name_exactly_the_colours_the_words_name():
    """Facts are recorded while the words are chosen: a colour word in the text <=> a colour fact."""
    params = SceneParams()
    words = re.compile(r"\b(" + "|".join(_COLOUR_SYNONYMS) + r")\b")
    checked = 0
    for k, scene in enumerate(synth_scenes(params, 300)):
        for caption in caption_scene(scene, rng_for(0, "train", STREAM_CAPTIONS, k), params.caption_detail):
            named = {_COLOUR_SYNONYMS[w] for w in words.findall(caption.text.lower())}
            stated = {f.split(",")[1][:-1] for f in caption.facts if f.startswith("colour(")}
            assert named == stated, (caption.text, caption.facts)
            assert _holds(caption.facts, scene)
            checked += 1
    assert checked == 1500


def test_contrast_captions_state_the_change_and_are_false_for_the_sibling():
    params = SceneParams(family_share=1.0, max_variants=3)
    plain = contrasted = 0
    for family, (start, size) in enumerate(family_plan(400, params, 0, "train")):
        scenes = sample_family(params, 0, "train", family, size)
        ordinary = caption_family(scenes, 0, "train", start, params.caption_detail)
        contrast = caption_family(scenes, 0, "train", start, params.caption_detail, contrast=2)
        for k, scene in enumerate(scenes):
            assert contrast[k][:3] == ordinary[k][:3]  # only the last two captions are replaced
            for j in (3, 4):
                caption = contrast[k][j]
                assert _holds(caption.facts, scene)
                if caption == ordinary[k][j] or scene.variant == "single":
                    plain += 1
                    continue
                contrasted += 1
                if k == 0:  # the base against the variant it targets
                    target = scenes[1 + (j - 3) % (size - 1)]
                    assert not _holds(caption.facts, target)
                else:
                    assert not any(_holds(caption.facts, s) for m, s in enumerate(scenes) if m != k)
    assert contrasted > 0.9 * (plain + contrasted)


def test_within_family_recall_ranks_only_family_members_ties_by_expected_rank():
    sims = np.full((5, 10), 9.0)  # out-of-family scores are high: they must be ignored
    sims[0, :6] = [0.9, 0.1, 0.5, 0.2, 0.3, 0.3]  # base: hit (0.9 > 0.5)
    sims[1, :6] = [0.7, 0.0, 0.7, 0.1, 0.0, 0.0]  # colour: tie 0.7 = 0.7, half a hit
    sims[2, :6] = [0.1, 0.1, 0.1, 0.1, 0.2, 0.8]  # count: hit
    family, change = [7, 7, 7, 8, 9], ["base", "colour", "count", "single", "single"]
    got = within_family(sims, family, change, captions_per_image=2)
    # caption queries: c0 hit (0.9 > 0.7), c1 tie with image 2 (half), c2 hit, c3 miss (0.1 < 0.2),
    # c4 miss (0.2 < 0.3), c5 hit
    assert got == {
        "all": {"i2t_r1": pytest.approx(250 / 3), "t2i_r1": pytest.approx(350 / 6), "images": 3.0,
                "mean_family_size": 3.0},
        "base": {"i2t_r1": 100.0, "t2i_r1": 75.0, "images": 1.0, "mean_family_size": 3.0},
        "colour": {"i2t_r1": 50.0, "t2i_r1": 50.0, "images": 1.0, "mean_family_size": 3.0},
        "count": {"i2t_r1": 100.0, "t2i_r1": 50.0, "images": 1.0, "mean_family_size": 3.0},
    }
    # constant scores: chance within a family of 3 (image: 2 own of 6 captions first, 1/3;
    # caption: its image first of 3, 1/3)
    constant = within_family(np.zeros((5, 10)), family, change, captions_per_image=2)
    assert constant["all"]["i2t_r1"] == pytest.approx(100 / 3) and constant["all"]["t2i_r1"] == pytest.approx(100 / 3)
    with pytest.raises(ValueError, match="need sims"):
        within_family(np.zeros((5, 9)), family, change, captions_per_image=2)


def _worker_signals(chunk: object) -> tuple:
    """Stands in for the chunk renderer in a pool worker: the worker's own signal dispositions."""
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def test_pool_workers_take_back_the_default_signals(monkeypatch) -> None:
    """A forked worker must not keep its parent's SIGTERM handler (the demo's raises
    KeyboardInterrupt): ``Pool.terminate()`` relies on SIGTERM ending a worker, and one that
    survives it leaves the writer joining it forever."""
    monkeypatch.setattr(writer, "_render_chunk", _worker_signals)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        got = list(writer._run([None] * 4, 2))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [(signal.SIG_DFL, signal.SIG_DFL)] * 4
