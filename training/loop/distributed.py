"""Multi-process training under ``torchrun``: process group, sharding and global-batch gathers.

``torchrun --nproc_per_node=N -m aoq_cli.main train ...`` starts N copies of the command with
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in their environment. :func:`init_from_env` sees them
and joins the process group (``nccl`` on CUDA, ``gloo`` on the CPU); without them everything
here is a no-op and training runs as one process. The trainer wraps the model in
``DistributedDataParallel`` (one process per device) and lets rank 0 alone write state,
checkpoints and metrics (docs/gpu.md, "Several GPUs").

The global batch is ``batch_size`` pairs; rank ``r`` of ``W`` trains on rows
``[r B / W, (r + 1) B / W)`` of it (:func:`shard_batch`). The in-batch losses need every
negative of the *global* batch, so the steps gather the embeddings of all ranks
(:func:`gather_groups`). The choice: gather the other ranks' rows without gradient and splice
in the local rows with theirs. Every rank then computes the same global loss ``L`` but
back-propagates only through its own rows; DDP averages the parameter gradients over the W
ranks, so the local rows' gradient is scaled by W in the splice (:func:`_scale_grad`) and the
average equals ``dL/dtheta`` of one process with the whole batch. This needs no collective in
the backward pass (``torch.distributed.nn.functional.all_gather`` would sum the gradients of
all ranks back with an all-to-all, which is equivalent but costs a second exchange).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Shard:
    """This process's place: ``rank`` of ``world`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes state, checkpoints and metrics."""
        return self.rank == 0


def current() -> Shard:
    """The shard of this process: from the joined process group, or a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return Shard()
    return Shard(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher setting ``WORLD_SIZE``) started this process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(device: str = "auto") -> Shard:
    """Join the process group when started by torchrun; a no-op (single process) otherwise.

    Args:
        device: the configured device; ``auto``/``cuda`` with CUDA present selects ``nccl`` and
            ``cuda:LOCAL_RANK`` (one process per GPU), anything else ``gloo`` on the CPU.

    Raises:
        RuntimeError: more processes on a node than it has GPUs.
    """
    if not launched_by_torchrun() or dist.is_initialized():
        return current()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs: "
                               "use --nproc_per_node <= the number of GPUs")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=60))
    return current()


def device_for(configured: str, shard: Shard) -> str:
    """The device of this rank: ``cuda:LOCAL_RANK`` when the group runs on CUDA, else as configured."""
    if shard.world > 1 and dist.get_backend() == "nccl":
        return f"cuda:{shard.local_rank}"
    return configured


def shard_batch(indices: list[int], shard: Shard) -> list[int]:
    """This rank's contiguous slice of a global batch.

    Raises:
        ValueError: the global batch does not split evenly over the ranks.
    """
    if len(indices) % shard.world:
        raise ValueError(f"batch of {len(indices)} does not split over {shard.world} processes: "
                         "make batch_size a multiple of --nproc_per_node")
    size = len(indices) // shard.world
    return indices[shard.rank * size : (shard.rank + 1) * size]


def _scale_grad(x: Tensor, factor: int) -> Tensor:
    """``x`` in value, ``factor * dx`` in gradient (undoes DDP's average over the ranks)."""
    if factor == 1 or not x.requires_grad:
        return x
    return x + (factor - 1) * (x - x.detach())


def gather_groups(x: Tensor, groups: int = 1) -> Tensor:
    """The global batch from every rank's local rows, group by group.

    ``x`` holds ``groups`` consecutive blocks of b local rows (round 2: positives, offline items,
    derived items). The result holds ``groups`` blocks of ``W b`` rows, each the ranks' blocks
    in rank order, i.e. exactly what one process would hold for the global batch. The local rows
    keep their gradient (scaled, see the module docstring); the others carry none.
    """
    shard = current()
    if shard.world == 1:
        return x
    blocks = x.chunk(groups)
    out = []
    for block in blocks:
        parts = [torch.empty_like(block) for _ in range(shard.world)]
        dist.all_gather(parts, block.detach().contiguous())
        parts[shard.rank] = _scale_grad(block, shard.world)
        out.extend(parts)
    return torch.cat(out)


def shutdown() -> None:
    """Leave the process group (no-op for one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op for one process)."""
    if current().world > 1:
        dist.barrier()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a ``DistributedDataParallel`` wrapper (the model itself otherwise)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
