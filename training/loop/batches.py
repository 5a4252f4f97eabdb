"""The batches of an epoch: a seeded shuffle per epoch and a loader that can skip the batches a
resumed run already trained, without loading them (the trainer's data-order contract)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from aoq_train.loop import distributed


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s data generator: a pure function of (seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0] >> 1)


def shuffled_batches(n_items: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """A random permutation of ``range(n_items)`` cut into batches.

    Only full batches are kept (a tiny last batch gives the in-batch losses almost no negatives),
    except when there are fewer items than ``batch_size``: then all of them form one batch.
    """
    order = torch.randperm(n_items, generator=generator).tolist()
    if n_items < batch_size:
        return [order] if n_items else []
    n_full = n_items // batch_size
    return [order[k * batch_size : (k + 1) * batch_size] for k in range(n_full)]


def epoch_loader(
    dataset: Dataset,
    batch_size: int,
    collate_fn: Callable[[list], Any],
    generator: torch.Generator,
    skip_batches: int = 0,
    num_workers: int = 0,
) -> DataLoader:
    """One epoch of shuffled batches of a map-style dataset, minus the first ``skip_batches``.

    The order depends on ``generator`` alone; skipped batches are never loaded. Under torchrun
    every rank draws the same global batches and loads only its slice of each
    (:func:`aoq_train.loop.distributed.shard_batch`). The generator
    is also handed to the DataLoader, which draws its worker base seed from it rather than from
    the global RNG (a resumed run would otherwise see different global random numbers).
    """
    batches = shuffled_batches(len(dataset), batch_size, generator)[skip_batches:]
    shard = distributed.current()
    if shard.world > 1:
        batches = [distributed.shard_batch(b, shard) for b in batches]
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_fn,
        num_workers=num_workers,
        generator=generator,
        persistent_workers=False,
    )
