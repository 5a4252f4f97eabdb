"""Uploads are decoded within a memory budget: a small file that expands to a large image is
reduced before any 8-bit or float conversion, and concurrent decodes share the budget.

The server test reads the peak resident memory (``VmHWM``) of a real ``aoq serve`` process
before and after rounds of six concurrent uploads of a 6300 x 6300 16-bit PNG (about 77 KB on disk).
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from aoq_serve.search.decode import MemoryBudget, decode_cost, decode_upload
from tests.backend_helpers import build_service_fixture, serve_process

#: the budget the server test runs with, and the allowance on top of it for everything else a
#: request holds (the upload bytes, the form parser, the model's work on the reduced image, and
#: what worker threads keep once they have run an upload: docs/serving.md, Uploads).
BUDGET_MB = 256
OTHER_MB = 300
SIDE = 6300
#: rounds of six concurrent uploads: the peak grows with the rounds (then levels), not per round
ROUNDS = 3


def big_png16(side: int = SIDE) -> bytes:
    """A mostly flat 16-bit grey PNG: tiny on disk, ``side * side * 2`` bytes once decoded."""
    pixels = np.zeros((side, side), dtype=np.uint16)
    pixels[side // 4 : side // 2, side // 3 : side // 2] = 60000
    pixels[side // 2 :, : side // 5] = 1234
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


@pytest.mark.slow
def test_rounds_of_six_concurrent_16_bit_uploads_stay_within_the_budget(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    data = big_png16()
    assert len(data) < 200_000
    small = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(small, format="PNG")
    with serve_process(fx, decode_memory_budget_mb=BUDGET_MB) as (port, proc), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        # Warm up both image paths (region extractor and CNN) with a small upload.
        for model in ("aoq", "pixels"):
            files = {"file": ("q.png", small.getvalue(), "image/png")}
            assert client.post("/search/image", data={"model": model, "k": 3}, files=files).status_code == 200
        before = _vm_hwm_mb(proc.pid)
        statuses: list[int] = []

        def upload(model: str) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
                r = c.post("/search/image", data={"model": model, "k": 3}, files={"file": ("big.png", data, "image/png")})
                statuses.append(r.status_code)

        peaks = []
        for _ in range(ROUNDS):  # the peak is the worst overlap of decodes and model work: repeat it
            threads = [threading.Thread(target=upload, args=(("aoq", "pixels")[i % 2],)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            peaks.append(_vm_hwm_mb(proc.pid) - before)
    print(f"server peak RSS {before:.0f} MB before; after each of {ROUNDS} rounds of six concurrent {SIDE}x{SIDE} "
          f"16-bit PNG uploads ({len(data) // 1000} KB each): " + ", ".join(f"+{p:.0f}" for p in peaks) +
          f" MB (budget {BUDGET_MB} MB)")
    assert statuses == [200] * 6 * ROUNDS
    assert peaks[-1] <= BUDGET_MB + OTHER_MB


# ----------------------------------------------------------------------------- units


def _encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def test_large_uploads_are_reduced_to_the_working_side_keeping_their_mode():
    image = decode_upload(big_png16(2000), max_pixels=40_000_000, max_side=500)
    assert image.size == (500, 500) and image.mode == "I;16"
    jpeg = Image.fromarray(np.random.default_rng(0).integers(0, 255, (1200, 1600, 3), dtype=np.uint8))
    decoded = decode_upload(_encoded(jpeg, "JPEG"), max_pixels=40_000_000, max_side=400)
    assert decoded.size == (400, 300) and decoded.mode == "RGB"


def test_small_uploads_are_decoded_unchanged():
    original = Image.fromarray(np.random.default_rng(1).integers(0, 255, (30, 40, 3), dtype=np.uint8))
    decoded = decode_upload(_encoded(original, "PNG"), max_pixels=10_000, max_side=1024)
    assert decoded.size == (40, 30) and np.array_equal(np.asarray(decoded), np.asarray(original))


def test_decode_cost_counts_the_full_size_buffer_of_the_stored_mode():
    # full size, the resize's first pass (reduced width, full height), the reduced copy
    assert decode_cost(Image.open(io.BytesIO(big_png16(1000))), max_side=100) == \
        1000 * 1000 * 2 + 100 * 1000 * 2 + 100 * 100 * 4
    rgb = Image.open(io.BytesIO(_encoded(Image.new("RGB", (300, 200)), "PNG")))
    assert decode_cost(rgb, max_side=1024) == 300 * 200 * 4 * 2


#: run in a fresh process, so that its peak resident memory is the decode's alone.
_MEASURE = """
import sys, threading
from PIL import Image
from aoq_serve.search.decode import MemoryBudget, decode_cost, decode_upload
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
data = open(sys.argv[1], "rb").read()
start, peak_before = status("VmRSS"), status("VmHWM")
cost = decode_cost(Image.open(sys.argv[1]), 1024)
budget = MemoryBudget(2**40)  # everything at once: the decodes' own heaps
for _ in range(int(sys.argv[2])):
    threads = [threading.Thread(target=decode_upload, args=(data, 10**9, 1024, budget)) for _ in range(int(sys.argv[3]))]
    [t.start() for t in threads]
    [t.join() for t in threads]
print(cost, status("VmHWM") - peak_before, status("VmRSS") - start)
"""
MB = 2**20


def _decoded_in_a_fresh_process(path: Path, rounds: int = 1, threads: int = 1) -> tuple[int, int, int]:
    """(decode_cost, peak growth, resident growth after) of decoding ``path``, in bytes."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(rounds), str(threads)], check=True,
                         capture_output=True, text=True, timeout=300).stdout.split()
    cost, peak, after = (int(x) for x in out)
    return cost, peak, after


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "I;16", "RGB", "1", "CMYK"])
def test_decode_cost_covers_every_mode_pillow_converts_through(tmp_path: Path, mode: str):
    """The alpha modes cost twice the full-size buffer (Pillow resizes a premultiplied copy)."""
    side, path = 3000, tmp_path / "upload"
    image = Image.fromarray(np.full((side, side), 300, np.uint16)) if mode == "I;16" else \
        Image.new("RGB", (side, side), (20, 90, 200)).convert(mode)
    image.save(path, format="JPEG" if mode == "CMYK" else "PNG")
    cost, peak, _ = _decoded_in_a_fresh_process(path)
    # the decoders' own row buffers come on top (a few MB)
    assert peak <= cost * 1.05 + 4 * MB, f"{mode}: peak +{peak / MB:.0f} MB, budgeted {cost / MB:.0f} MB"


def test_memory_of_concurrent_decodes_is_returned_after(tmp_path: Path):
    path = tmp_path / "upload.png"
    Image.new("RGBA", (3000, 3000), (20, 90, 200, 128)).save(path)
    _, peak, after = _decoded_in_a_fresh_process(path, rounds=3, threads=4)
    assert after <= 30 * MB, f"resident +{after / MB:.0f} MB after decodes that peaked at +{peak / MB:.0f} MB"


def test_memory_budget_admits_reservations_up_to_the_budget_and_queues_the_rest():
    budget = MemoryBudget(100)
    order: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def second() -> None:
        with budget.reserve(50):
            order.append("second")
            entered.set()
            release.wait(10)

    with budget.reserve(60):
        waiting = threading.Thread(target=second)
        waiting.start()
        assert not entered.wait(0.3) and budget.in_use == 60  # 60 + 50 > 100: the second one waits
        order.append("first done")
    assert entered.wait(10) and budget.in_use == 50
    release.set()
    waiting.join(timeout=10)
    assert order == ["first done", "second"] and budget.in_use == 0
    # A reservation larger than the whole budget runs alone instead of never.
    budget = MemoryBudget(100)
    with budget.reserve(500):
        assert budget.in_use == 100
    assert budget.in_use == 0
