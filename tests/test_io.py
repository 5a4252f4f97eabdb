"""Atomic writes and manifests: a reader never sees a half-written artefact."""

import json

import numpy as np
import pytest

from aoq.io import (
    ArtefactError,
    atomic_dir,
    atomic_save_npy,
    atomic_write_json,
    read_manifest,
    sha256_file,
    write_manifest,
)


def test_atomic_write_json_leaves_no_temp_files(tmp_path):
    path = atomic_write_json(tmp_path / "a" / "x.json", {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_atomic_save_npy_is_memory_mappable(tmp_path):
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    atomic_save_npy(tmp_path / "ids.npy", arr)
    loaded = np.load(tmp_path / "ids.npy", mmap_mode="r")
    assert isinstance(loaded, np.memmap)
    np.testing.assert_array_equal(loaded, arr)


def test_atomic_dir_failure_keeps_old_version(tmp_path):
    final = tmp_path / "art"
    with atomic_dir(final) as d:
        (d / "f.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as d:
            (d / "f.txt").write_text("new")
            raise RuntimeError("crash mid-write")
    assert (final / "f.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_atomic_dir_replaces_existing(tmp_path):
    final = tmp_path / "art"
    for text in ("one", "two"):
        with atomic_dir(final) as d:
            (d / "f.txt").write_text(text)
    assert (final / "f.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_manifest_detects_corruption_truncation_and_kind(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"0123456789")
    manifest = write_manifest(tmp_path, "thing", {"lr": 0.1})
    assert manifest["files"] == {"w.bin": sha256_file(tmp_path / "w.bin")}
    assert read_manifest(tmp_path, "thing")["config"] == {"lr": 0.1}
    with pytest.raises(ArtefactError, match="expected 'other'"):
        read_manifest(tmp_path, "other")
    (tmp_path / "w.bin").write_bytes(b"01234")
    with pytest.raises(ArtefactError, match=r"w\.bin: content hash mismatch"):
        read_manifest(tmp_path, "thing")
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ArtefactError, match=r"w\.bin: listed in the manifest but missing"):
        read_manifest(tmp_path, "thing")


def test_manifest_missing_or_garbled(tmp_path):
    with pytest.raises(ArtefactError, match="manifest missing"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtefactError, match="not valid JSON"):
        read_manifest(tmp_path)
    with pytest.raises(ArtefactError, match="no such artefact directory"):
        read_manifest(tmp_path / "nope")
