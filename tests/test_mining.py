"""Offline mining: identical ids to a brute-force reference (ties included), both backends,
the safety valves of the streamed selection, the artefact, and resumption after kill -9."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from aoq.io import ArtefactError
from aoq_train.mining import (
    decode_ids,
    decode_scores,
    driver,
    encode_keys,
    load_mined,
    mine_offline_negatives,
    save_mined,
)
from aoq_train.mining import canonical, job
from aoq_train.mining import topk as mining
from aoq_train.mining.driver import product_precision
from aoq_train.mining.keys import LOWEST
from tests.mining_helpers import Stop, canonical_reference, exact_embeddings, reference, stop_at

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("backend", ["torch", "faiss"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identical_to_brute_force_with_exact_ties(backend: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_img, cpi = 23, [1, 3, 5][seed]
    img = exact_embeddings(rng, n_img, 4, 2)  # 5 values per coordinate, d=4: massive ties
    cap = exact_embeddings(rng, n_img * cpi, 4, 2)
    ht, hi = n_img * cpi - cpi, 7
    ref = reference(img, cap, cpi, ht, hi)
    s = img @ cap.T
    assert (np.sort(s, axis=1)[:, 1:] == np.sort(s, axis=1)[:, :-1]).any()  # there are ties
    for block, chunk in ((5, 4), (4, 1000), (1000, 9)):
        got = mine_offline_negatives(img, cap, cpi, ht, hi, block_size=block, backend=backend,
                                     gallery_chunk=chunk, progress=False)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])
        assert got[0].dtype == np.int32 and got[1].dtype == np.int32


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_identical_to_brute_force_many_chunks(backend: str) -> None:
    """Big enough for the sampled first chunk, the estimated threshold and several chunks."""
    rng = np.random.default_rng(7)
    n_img, cpi = 300, 5
    img = exact_embeddings(rng, n_img, 24, 32)
    cap = exact_embeddings(rng, n_img * cpi, 24, 32)
    ref = reference(img, cap, cpi, 60, 20)
    got = mine_offline_negatives(img, cap, cpi, 60, 20, block_size=64, backend=backend,
                                 gallery_chunk=256, progress=False)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


def test_random_unit_vectors_exclude_own_and_are_sorted() -> None:
    rng = np.random.default_rng(3)
    img = rng.standard_normal((50, 16)).astype(np.float32)
    cap = rng.standard_normal((250, 16)).astype(np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    cap /= np.linalg.norm(cap, axis=1, keepdims=True)
    caps, imgs = mine_offline_negatives(img, cap, 5, 40, 10, block_size=16, gallery_chunk=64, progress=False)
    s = img.astype(np.float64) @ cap.T.astype(np.float64)
    for i in range(50):
        assert not set(caps[i]) & set(range(5 * i, 5 * i + 5))
        assert len(set(caps[i])) == 40
        assert np.all(np.diff(s[i, caps[i]]) <= 1e-6)  # best first
        others = np.setdiff1d(np.arange(250), np.r_[caps[i], 5 * i : 5 * i + 5])
        assert s[i, caps[i]].min() >= s[i, others].max() - 1e-6
    assert all(c // 5 not in imgs[c] for c in range(250))


def _direction(img, cap, cpi, ht):
    return mining.directions(img, cap, cpi, ht, 1)[0]


def test_threshold_guessed_too_high_redoes_rows_exactly() -> None:
    rng = np.random.default_rng(4)
    img, cap = exact_embeddings(rng, 30, 8, 4), exact_embeddings(rng, 90, 8, 4)
    ref = reference(img, cap, 3, 20, 1)[0]
    direction = _direction(img, cap, 3, 20)
    too_high = np.full(30, 1e9, dtype=np.float32)  # no score passes: every row ends short
    got = mining.block_topk_torch(direction, torch.from_numpy(img), np.arange(30),
                                   torch.from_numpy(cap), 16, threshold=too_high)
    np.testing.assert_array_equal(got, ref)
    # the exact redo works in row groups
    got = mining.exact_rows(direction, torch.from_numpy(img), np.arange(30), torch.from_numpy(cap), rows_at_once=7)
    np.testing.assert_array_equal(got, ref)


def test_candidate_cap_compacts_rows_exactly() -> None:
    rng = np.random.default_rng(5)
    img, cap = exact_embeddings(rng, 30, 8, 4), exact_embeddings(rng, 90, 8, 4)
    ref = reference(img, cap, 3, 20, 1)[0]
    direction = _direction(img, cap, 3, 20)
    compactions = []
    original = mining.Candidates.compact

    def counting(self, k, slack=0.0):
        compactions.append(k)
        return original(self, k, slack)

    mining.Candidates.compact = counting
    try:
        lowest = np.full(30, LOWEST, dtype=np.float32)  # everything is a candidate
        got = mining.block_topk_torch(direction, torch.from_numpy(img), np.arange(30),
                                       torch.from_numpy(cap), 16, threshold=lowest, cap=20)
    finally:
        mining.Candidates.compact = original
    assert len(compactions) >= 3
    np.testing.assert_array_equal(got, ref)


def test_keys_order_scores_then_lower_id() -> None:
    scores = np.array([0.5, 0.5, -0.0, 0.0, -1.5, 2.0, -np.inf], dtype=np.float32)
    ids = np.array([9, 3, 4, 2, 0, 7, 1])
    keys = encode_keys(scores, ids)
    np.testing.assert_array_equal(decode_ids(keys), ids)
    np.testing.assert_array_equal(decode_scores(keys), scores + np.float32(0.0))
    order = np.argsort(-keys, kind="stable")
    np.testing.assert_array_equal(ids[order], [7, 3, 9, 2, 4, 0, 1])  # -0.0 ties +0.0: lower id first


def test_bad_inputs_are_clear_errors() -> None:
    img, cap = np.zeros((4, 3), np.float32), np.zeros((8, 3), np.float32)
    with pytest.raises(ValueError, match="top_captions=7"):
        mine_offline_negatives(img, cap, 2, 7, 1, progress=False)
    with pytest.raises(ValueError, match="top_images=4"):
        mine_offline_negatives(img, cap, 2, 1, 4, progress=False)
    with pytest.raises(ValueError, match="8 captions for 4 images x 3"):
        mine_offline_negatives(img, cap, 3, 1, 1, progress=False)
    cap[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mine_offline_negatives(img, cap, 2, 1, 1, progress=False)


# --------------------------------------------------------------------------- the artefact


def test_save_and_load_roundtrip_memory_mapped(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.arange(18, dtype=np.int32).reshape(9, 2)
    manifest = save_mined(tmp_path / "mined", a, b, {"checkpoint_hash": "abc"}, config={"x": 1})
    assert manifest["kind"] == "mined_negatives" and manifest["top_captions"] == 4 and manifest["top_images"] == 2
    mined = load_mined(tmp_path / "mined")
    assert isinstance(mined.img_top_caps, np.memmap) and not mined.img_top_caps.flags.writeable
    np.testing.assert_array_equal(mined.img_top_caps, a)
    np.testing.assert_array_equal(mined.cap_top_imgs, b)
    assert (mined.checkpoint_hash, mined.captions_per_image) == ("abc", 3)
    assert json.loads((tmp_path / "mined" / "manifest.json").read_text())["shapes"] == {
        "img_top_caps.npy": [3, 4], "cap_top_imgs.npy": [9, 2]}
    assert sorted(p.name for p in (tmp_path / "mined").iterdir()) == [
        "cap_top_imgs.npy", "img_top_caps.npy", "manifest.json"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_artefact_names_the_file(tmp_path: Path, damage: str) -> None:
    save_mined(tmp_path / "m", np.zeros((3, 4), np.int32), np.zeros((9, 2), np.int32))
    victim = tmp_path / "m" / "cap_top_imgs.npy"
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[:-8])
    elif damage == "flip":
        victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        victim.unlink()
    with pytest.raises(ArtefactError, match="cap_top_imgs.npy"):
        load_mined(tmp_path / "m")


def test_foreign_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ArtefactError, match="manifest"):
        load_mined(tmp_path)


# --------------------------------------------------------------------------- resumption


def _data(seed: int = 11):
    rng = np.random.default_rng(seed)
    return exact_embeddings(rng, 40, 8, 8), exact_embeddings(rng, 120, 8, 8)


def test_interrupted_run_resumes_skipping_finished_blocks(tmp_path: Path, monkeypatch) -> None:
    img, cap = _data()
    expected = mine_offline_negatives(img, cap, 3, 30, 9, block_size=8, progress=False)

    seen = []

    def stop_after_seven(direction, first):
        seen.append((direction, first))
        if len(seen) == 7:  # 5 image blocks, then 2 of the 15 caption blocks
            raise Stop

    with pytest.raises(Stop):
        mine_offline_negatives(img, cap, 3, 30, 9, block_size=8, work_dir=tmp_path, progress=False,
                               on_block=stop_after_seven)
    saved = {path.name for path in (tmp_path / "parts").glob("*.npy")}
    assert {f"{name}_{first:010d}.npy" for name, first in seen} <= saved  # every reported block is on disk
    # caption blocks are saved a few at once: those not yet started when the stop came are dropped
    missing = [first for first in range(0, 120, 8) if f"cap_top_imgs_{first:010d}.npy" not in saved]
    assert missing

    computed = []
    original = mining.block_topk_torch

    def counting(direction, queries, query_ids, *args, **kwargs):
        computed.append((direction.name, int(query_ids[0])))
        return original(direction, queries, query_ids, *args, **kwargs)

    monkeypatch.setattr(driver, "block_topk_torch", counting)
    got = mine_offline_negatives(img, cap, 3, 30, 9, block_size=8, work_dir=tmp_path, progress=False)
    assert computed == [("cap_top_imgs", first) for first in missing]
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_parts_of_another_job_are_discarded(tmp_path: Path) -> None:
    img, cap = _data()
    mine_offline_negatives(img, cap, 3, 30, 9, block_size=8, work_dir=tmp_path, progress=False)
    stale = tmp_path / "parts" / "img_top_caps_0000000000.npy"
    np.save(stale, np.zeros((8, 30), np.int32))  # would be reused by the same job
    got = mine_offline_negatives(img, cap, 3, 31, 9, block_size=8, work_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(got[0], reference(img, cap, 3, 31, 9)[0])
    assert json.loads((tmp_path / "job.json").read_text())["top_captions"] == 31


_KILLED_CHILD = """
import os, signal, sys
import numpy as np
sys.path.insert(0, {repo!r})
from aoq_train.mining import mine_offline_negatives
data = np.load({data!r})
def die(direction, first):
    if direction == "cap_top_imgs" and first == 24:
        os.kill(os.getpid(), signal.SIGKILL)
mine_offline_negatives(data["img"], data["cap"], 3, 30, 9, block_size=8, work_dir={work!r},
                       progress=False, on_block=die)
"""


@pytest.mark.slow
def test_resumes_after_sigkill(tmp_path: Path) -> None:
    img, cap = _data(12)
    np.savez(tmp_path / "data.npz", img=img, cap=cap)
    work = tmp_path / "work"
    code = _KILLED_CHILD.format(repo=str(REPO), data=str(tmp_path / "data.npz"), work=str(work))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    names = {p.name for p in (work / "parts").iterdir() if not p.name.startswith(".")}
    # every image block and the caption blocks up to row 24; the caption blocks are written one
    # per core, so the last one (row 32) may be on disk before block 24 is reported, or not
    saved = {f"img_top_caps_{first:010d}.npy" for first in range(0, 40, 8)} | {
        f"cap_top_imgs_{first:010d}.npy" for first in range(0, 32, 8)}
    assert saved <= names <= saved | {"cap_top_imgs_0000000032.npy"}, sorted(names)
    got = mine_offline_negatives(img, cap, 3, 30, 9, block_size=8, work_dir=work, progress=False)
    ref = reference(img, cap, 3, 30, 9)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_matches_on_exact_data(precision: str) -> None:
    """Entries k/8 with d = 16: float16 holds them exactly and every product is exact in float32."""
    rng = np.random.default_rng(9)
    img, cap = exact_embeddings(rng, 200, 16, 8), exact_embeddings(rng, 1000, 16, 8)
    ref = reference(img, cap, 5, 50, 20)
    got = mine_offline_negatives(img, cap, 5, 50, 20, block_size=64, device="cuda", gallery_chunk=128,
                                 precision=precision, progress=False)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


# --------------------------------------------------------------------------- aoq mine


def test_aoq_mine_from_the_checkpoint_config_skips_when_up_to_date(tmp_path: Path, capsys, monkeypatch) -> None:
    from aoq.checkpoint import save_checkpoint
    from aoq_cli.main import main as cli_main
    from aoq.config import config_from_dict
    from aoq.data.load import load_split
    from aoq.data.vocab import Vocabulary
    from aoq.embed import encode_split
    from aoq.models.joint import build_model
    from tests.fixtures import write_precomp_fixture

    data = write_precomp_fixture(tmp_path / "data", {"train": 12, "dev": 3, "test": 3}, regions=2, dim=6)
    cfg = config_from_dict({
        "name": "m", "out_dir": str(tmp_path / "run"), "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"embed_dim": 8, "word_dim": 8}, "mining": {"top_captions": 20, "top_images": 5},
        "round2": {"h_t": 10, "h_i": 2},
    })
    split = load_split(cfg.data, "train")
    vocab = Vocabulary.build(split.captions, 1)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(vocab), 6)
    save_checkpoint(tmp_path / "ckpt", model, cfg, vocab, {"rsum": 0.0})

    assert cli_main(["mine", "--checkpoint", str(tmp_path / "ckpt"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "mined in" in printed
    mined = load_mined(tmp_path / "run" / "mined")
    # both shares, and the regime map's advice (or that there is no reliable predictor)
    from aoq_train.regimes.advice import advice_line, read_evidence

    assert "  false negatives 0.0% of the sampled candidates, near neighbours unknown" in printed
    assert f"  {advice_line(mined.diagnostics, read_evidence())}\n" in printed
    img, cap = encode_split(model, vocab, split)  # the teacher's embeddings of the train split
    ref = mine_offline_negatives(img, cap, 5, 20, 5, progress=False)
    np.testing.assert_array_equal(mined.img_top_caps, ref[0])
    np.testing.assert_array_equal(mined.cap_top_imgs, ref[1])

    before = (tmp_path / "run" / "mined" / "manifest.json").stat().st_mtime_ns
    assert cli_main(["mine", "--checkpoint", str(tmp_path / "ckpt"), "--no-progress"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert (tmp_path / "run" / "mined" / "manifest.json").stat().st_mtime_ns == before
    auto = product_precision(torch.device("cpu"), "torch", "auto")  # this CPU's choice
    assert load_mined(tmp_path / "run" / "mined").manifest["precision"] == auto

    assert load_mined(tmp_path / "run" / "mined").manifest["ranking"] == canonical.RULE

    # other products give the same canonical lists: still up to date
    other, products = ("fp32", "float32") if auto == "bfloat16+float32" else ("bf16", "bfloat16+float32")
    other_products = ["mine", "--checkpoint", str(tmp_path / "ckpt"), "--no-progress",
                      "--set", f"mining.precision={other}"]
    assert cli_main(other_products) == 0
    assert "up to date" in capsys.readouterr().out
    # an artefact ranked by another rule (an older version's) is mined again
    monkeypatch.setattr(job, "RULE", "float32 scores, then id")
    assert cli_main(other_products) == 0
    assert "mined in" in capsys.readouterr().out
    again = load_mined(tmp_path / "run" / "mined")
    assert again.manifest["precision"] == products and again.manifest["ranking"] == "float32 scores, then id"
    np.testing.assert_array_equal(again.img_top_caps, ref[0])
    np.testing.assert_array_equal(again.cap_top_imgs, ref[1])
    monkeypatch.undo()
    assert cli_main(["mine", "--checkpoint", str(tmp_path / "ckpt"), "--set", "mining.precision=fp16"]) == 2
    assert "mining precision fp16 does not run on cpu" in capsys.readouterr().err

    assert cli_main(["mine", "--checkpoint", str(tmp_path / "ckpt"), "--no-progress", "--top-images", "3",
                     "--backend", "faiss", "--set", "round2.h_i=3"]) == 0
    assert "mined in" in capsys.readouterr().out
    assert load_mined(tmp_path / "run" / "mined").cap_top_imgs.shape == (60, 3)

    assert cli_main(["mine", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "nope/config.json" in capsys.readouterr().err


@pytest.mark.parametrize("cpi", [1, 5])
def test_bf16_filter_gives_the_brute_force_ids(cpi: int) -> None:
    """bf16 products filter, float32 re-scoring decides: identical ids to the float32 brute force
    (exact data, ties included: the values are representable in bfloat16 too)."""
    rng = np.random.default_rng(7)
    img = exact_embeddings(rng, 60, 6, 2)
    cap = exact_embeddings(rng, 60 * cpi, 6, 2)
    ref = reference(img, cap, cpi, 50, 7)
    got = mine_offline_negatives(img, cap, cpi, 50, 7, block_size=16, gallery_chunk=32, precision="bf16",
                                 progress=False)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


def test_bf16_filter_on_random_vectors_gives_the_canonical_lists() -> None:
    """On ordinary float data the bf16 error is far above float32's: the margin must still let
    every member of the canonical top-k through, and the canonical re-scoring decides the order,
    so the lists are the canonical brute force's, byte for byte, like fp32 mode's."""
    gen = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(600, 48, generator=gen), dim=1).numpy()
    cap = torch.nn.functional.normalize(torch.randn(3000, 48, generator=gen), dim=1).numpy()
    ref = canonical_reference(img, cap, 5, 100, 20)
    for precision in ("bf16", "int8", "fp32"):
        got = mine_offline_negatives(img, cap, 5, 100, 20, block_size=256, gallery_chunk=1024, precision=precision,
                                     progress=False)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])
    with pytest.raises(ValueError, match="precision"):
        mine_offline_negatives(img, cap, 5, 100, 20, precision="fp16", progress=False)


def test_product_precision_names_what_runs_and_refuses_what_cannot(monkeypatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # a device object needs no GPU
    assert product_precision(cpu, "torch", "fp32") == product_precision(cuda, "torch", "fp32") == "float32"
    assert product_precision(cpu, "torch", "bf16") == "bfloat16+float32"
    assert product_precision(cuda, "torch", "fp16") == "float16"
    assert product_precision(cpu, "faiss", "bf16") == "float32"  # FAISS scores in float32 whatever is asked
    for device, precision, hint in ((cuda, "bf16", "use fp16"), (cpu, "fp16", "use bf16"), (cpu, "fp64", "must be")):
        with pytest.raises(ValueError, match=hint):
            product_precision(device, "torch", precision)
    assert product_precision(cpu, "torch", "int8") == "int8+float32"
    with pytest.raises(ValueError, match="int8 on one CPU device"):  # the int8 filter is the fused pass's
        product_precision(cpu, "torch", "int8", fused=False)
    # auto: the bf16 filter where it pays (the int8 one where its products save much more), else
    # the int8 filter where it pays, else float32
    monkeypatch.setattr(driver, "bf16_speedup", lambda: 2.0)
    for bf16, beats, int8, products in ((True, False, True, "bfloat16+float32"), (True, True, False, "int8+float32"),
                                        (False, True, True, "int8+float32"), (False, True, False, "float32")):
        monkeypatch.setattr(driver, "bf16_pays", lambda pays=bf16: pays)
        monkeypatch.setattr(driver, "int8_beats_bf16", lambda speedup, beats=beats: beats and speedup == 2.0)
        monkeypatch.setattr(driver, "int8_pays", lambda pays=int8: pays)
        assert product_precision(cpu, "torch", "auto") == products
        assert product_precision(cpu, "torch", "auto", fused=False) == "float32"  # several CPU devices
        assert product_precision(cuda, "torch", "auto") == product_precision(cpu, "faiss", "auto") == "float32"


def test_blocks_shared_out_over_several_devices_give_the_same_ids(tmp_path: Path, monkeypatch) -> None:
    """Two devices (CPU here; GPUs on a multi-GPU machine): the blocks go to both, one thread each,
    and the lists equal the brute force; an interruption resumes from the saved blocks."""
    from aoq_train.mining import driver

    rng = np.random.default_rng(4)
    img, cap = exact_embeddings(rng, 70, 6, 4), exact_embeddings(rng, 210, 6, 4)
    threads = []
    original = driver.block_topk_torch

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(driver, "block_topk_torch", recording)

    with pytest.raises(Stop):
        mine_offline_negatives(img, cap, 3, 25, 7, block_size=16, device=["cpu", "cpu"], gallery_chunk=32,
                               work_dir=tmp_path, progress=False, on_block=stop_at("cap_top_imgs", 64))
    assert sorted(set(threads)) == ["mining-0-cpu_0", "mining-1-cpu_0"]  # one thread per device, both used
    first_run = len(threads)
    got = mine_offline_negatives(img, cap, 3, 25, 7, block_size=16, device=("cpu", "cpu"), gallery_chunk=32,
                                 work_dir=tmp_path, progress=False)
    ref = reference(img, cap, 3, 25, 7)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    # the image direction (5 blocks) and the caption blocks up to 64 (5 of 14) were saved, not redone
    assert len(threads) - first_run <= 14 - 5
    with pytest.raises(ValueError, match="all CUDA or all CPU"):
        driver._devices(["cpu", torch.device("meta")])
