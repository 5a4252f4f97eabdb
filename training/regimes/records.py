"""Finished jobs of a regime map, kept as small records (docs/regimes.md, Records).

A map costs hours of CPU and its run folders hundreds of megabytes, so it may be finished in
several sittings, on several machines. What the page reads from a finished job
(:func:`aoq_train.regimes.runs.read_job`: rsum and epochs per method, minutes, the round-1
predictors) is saved as one JSON file per job, ``<records>/<cell>/seed<replicate>.json``, small
enough to keep under version control beside the page. A record names what made it: the hash of
the job's identity (its cell and set, its replicate, its arms, the run's configuration without
the folders), so a record made under other settings is ignored and the job runs again.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aoq.io import atomic_write_json, sha256_json
from aoq_train.regimes.grid import Cell, data_seed

#: the record's format; a change makes every older record stale
FORMAT = 1


def job_identity(config: dict[str, Any], cell: Cell, replicate: int, arms: tuple[str, ...],
                 sizes: dict[str, int] | None) -> dict[str, Any]:
    """What a job's results depend on. ``config``: the job's run configuration as JSON; its
    folders (``out_dir``, ``data.path``) are left out, since they say where, not what."""
    config = {**config, "data": {k: v for k, v in config["data"].items() if k != "path"}}
    config.pop("out_dir", None)
    return {"format": FORMAT, "cell": cell.name, "replicate": replicate, "arms": list(arms),
            "sizes": cell.sizes(sizes), "scene": asdict(cell.params()), "data_seed": data_seed(cell, replicate),
            "config": config}


def record_path(folder: Path, cell: Cell, replicate: int) -> Path:
    return folder / cell.name / f"seed{replicate}.json"


def load_record(folder: Path, cell: Cell, replicate: int, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The job's saved results if a record of this very job is there, else None (missing,
    unreadable, or made under another identity)."""
    try:
        record = json.loads(record_path(folder, cell, replicate).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("identity_hash") != sha256_json(identity):
        return None
    return record.get("job")


def save_record(folder: Path, cell: Cell, replicate: int, identity: dict[str, Any], job: dict[str, Any]) -> Path:
    """Write (atomically) the record of a finished job."""
    return atomic_write_json(record_path(folder, cell, replicate),
                             {"identity_hash": sha256_json(identity), "identity": identity, "job": job})
