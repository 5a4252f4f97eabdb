"""The generic, resumable training loop shared by round 1 and round 2.

A round plugs in three functions and :func:`fit` does the rest (Adam, the learning-rate schedule
and budget of :mod:`aoq_train.loop.guards`, gradient clipping, validation and best-model
selection every epoch, checkpoints, a metrics log, crash-safe resumption)::

    result = fit(
        run_dir, cfg, cfg.train, model, vocab,
        make_loader=lambda epoch, generator, skip: epoch_loader(dataset, 128, collate, generator, skip),
        step=lambda model, batch: (loss_tensor, {"stat": float}),
        validate=lambda model: {"rsum": ..., "i2t": {...}, "t2i": {...}},
    )

Contract of the plugged functions:

- ``make_loader(epoch, generator, skip_batches)`` returns the batches of epoch ``epoch`` (0-based)
  with the first ``skip_batches`` left out. Every random choice of the epoch's data (order,
  sampled negatives) must come from ``generator`` -- a ``torch.Generator`` the trainer seeds from
  (``optim.seed``, epoch) and restores on resumption -- or be a pure function of the epoch and the
  item index, so a resumed epoch yields exactly the batches it would have yielded.
  :func:`aoq_train.loop.batches.epoch_loader` does this for a map-style dataset and skips without loading anything.
- ``step(model, batch) -> (loss, stats)``: moves the batch to the model's device, runs the model
  (in train mode) and returns a scalar loss tensor and a dict of floats to average over the epoch
  (logged as ``train_<name>``). The trainer does ``zero_grad``, ``backward``, clipping and the
  optimiser step. The global torch/numpy/python RNGs may be used; they are restored on resume.
- ``validate(model) -> dict`` is called under ``torch.no_grad()`` with the model in eval mode and
  must return ``"rsum"`` (higher is better; it selects the best epoch); nested dicts such as
  ``{"i2t": {"r1": ..}}`` are logged flattened as ``dev_i2t_r1``.

The caller seeds (``aoq.device.seed_everything``) *before* building the model, so the
initial weights are reproducible; :func:`fit` never re-seeds the global RNGs.

Files under ``run_dir``::

    state/state.pt  resumable state (model, optimiser, RNGs incl. the epoch's data
                    generator, epoch, step in epoch, config fingerprint), replaced atomically
                    every ``save_every_steps`` steps and at every epoch end
    state/progress.json  epoch / step_in_epoch / global_step of the saved state
    best/  last/    checkpoints (aoq.checkpoint) of the best-dev-rsum and the latest epoch
    metrics.jsonl   one JSON line per finished epoch (rewritten whole from the saved state); the
                    last one says why training stopped (``stop``: patience, plateau or cap)
    tensorboard/    scalar events, when torch.utils.tensorboard imports

Running :func:`fit` again on the same ``run_dir`` continues from ``state/`` (after ``kill -9``
too: the batches already trained in the interrupted epoch are skipped and the final weights equal
an uninterrupted run's); on a finished run it trains nothing and returns the recorded result.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from aoq.checkpoint import save_checkpoint
from aoq.config import ExperimentConfig, OptimConfig
from aoq.data.vocab import Vocabulary
from aoq.io import atomic_write_text
from aoq.models.joint import JointModel
from aoq_train.loop import distributed
from aoq_train.loop.batches import epoch_seed
from aoq_train.loop.guards import BudgetState, Stop, budget_state, check_collapse
from aoq_train.loop.state import (
    STATE_FILE,
    Progress,
    fingerprint,
    load_state,
    save_state,
)

log = logging.getLogger(__name__)

StepFn = Callable[[JointModel, Any], tuple[Tensor, dict[str, float]]]
MakeLoader = Callable[[int, torch.Generator, int], Iterable[Any]]
ValidateFn = Callable[[JointModel], dict]

@dataclass
class TrainResult:
    """What a :func:`fit` call ended with.

    Attributes:
        run_dir: the run folder.
        best_dir / last_dir: checkpoints of the best-dev-rsum epoch and of the last epoch.
        best_epoch: 1-based epoch of ``best_dir``; best_rsum: its dev rsum.
        epochs_done: epochs finished so far.
        history: the metrics.jsonl records, one per epoch.
        resumed: this call continued from saved state.
        already_finished: nothing was left to train (the call was a no-op).
        stopped_by: why training ended: ``patience`` or ``plateau`` (the run reached its dev
            plateau), ``cap`` (the epoch cap stopped it: it may not have converged).
    """

    run_dir: Path
    best_dir: Path
    last_dir: Path
    best_epoch: int
    best_rsum: float
    epochs_done: int
    history: list[dict] = field(default_factory=list)
    resumed: bool = False
    already_finished: bool = False
    stopped_by: Stop | None = None


# --------------------------------------------------------------------------- data order


# --------------------------------------------------------------------------- logging


def _flatten(metrics: dict, prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}_"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _write_metrics_log(run_dir: Path, history: list[dict]) -> None:
    atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in history))


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional (pyproject extra "tensorboard")
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


# --------------------------------------------------------------------------- the loop


def fit(
    run_dir: str | Path,
    cfg: ExperimentConfig,
    optim: OptimConfig,
    model: JointModel,
    vocab: Vocabulary,
    make_loader: MakeLoader,
    step: StepFn,
    validate: ValidateFn,
    *,
    role: str = "round1",
    extra: dict | None = None,
    progress_bar: bool = True,
) -> TrainResult:
    """Train ``model`` until its budget ends (``optim.schedule``: the dev plateau or the early stop,
    at most ``optim.epochs`` epochs), resuming from ``run_dir/state`` if present; with
    ``optim.collapse_epochs`` a collapsed run stops (:mod:`aoq_train.loop.guards`).

    Args:
        run_dir: the round's folder (e.g. ``runs/<name>/round1``).
        cfg: the whole run configuration (saved in checkpoints; its fingerprint guards resumption).
        optim: the section with the optimisation settings (``cfg.train`` or ``cfg.round2``).
        model: the freshly built model, already on its device (seed before building it).
        vocab: saved inside every checkpoint.
        make_loader, step, validate: see the module docstring.
        role: recorded in the checkpoints' extra.json and used in log lines.
        extra: more fields for the checkpoints' extra.json (e.g. the mined-negatives hash).
        progress_bar: show a tqdm bar (auto-hidden when stderr is not a terminal).

    Returns:
        A :class:`TrainResult`.

    Raises:
        ConfigError: ``run_dir/state`` belongs to a run with another configuration.
        ArtefactError: ``run_dir/state`` is corrupted.
        TrainingCollapsed: the collapse guard stopped the run (its checkpoints and log are kept).
    """
    run_dir = Path(run_dir)
    shard = distributed.current()
    config_fingerprint = fingerprint(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=optim.lr)
    loop = _Loop(run_dir=run_dir, cfg=cfg, optim=optim, model=model, vocab=vocab, make_loader=make_loader,
                 step=step, validate=validate, role=role, extra=extra or {}, progress_bar=progress_bar and shard.is_main,
                 fingerprint=config_fingerprint, params=params, optimizer=optimizer,
                 shard=shard, net=_distributed_model(model, shard))

    resumed = (run_dir / "state" / STATE_FILE).exists()
    prog = load_state(run_dir / "state", config_fingerprint, model, optimizer) if resumed else Progress()
    if resumed and shard.is_main:
        _write_metrics_log(run_dir, prog.history)  # a crash may have hit between state and log

    def budget() -> BudgetState:
        return budget_state([float(r["dev_rsum"]) for r in prog.history], optim)

    def result(already_finished: bool) -> TrainResult:
        return TrainResult(run_dir, run_dir / "best", run_dir / "last", prog.best_epoch, prog.best_rsum,
                           prog.epoch, list(prog.history), resumed, already_finished, stopped_by=budget().stop)

    check_collapse(prog.history, optim.collapse_epochs, role, optim)  # a resumed collapsed run stops at once
    if budget().stop is not None:
        log.info("%s: already finished (%d epochs, best dev rsum %.2f at epoch %d)",
                 run_dir, prog.epoch, prog.best_rsum, prog.best_epoch)
        return result(already_finished=True)
    if resumed:
        log.info("%s: resuming at epoch %d, step %d", run_dir, prog.epoch + 1, prog.step_in_epoch)

    loop.writer = _tensorboard(run_dir) if shard.is_main else None
    try:
        while (state := budget()).stop is None:
            for group in optimizer.param_groups:
                group["lr"] = optim.lr * optim.lr_decay_factor ** state.lr_drops
            loop.train_epoch(prog)
            check_collapse(prog.history, optim.collapse_epochs, role, optim)
    finally:
        if loop.writer is not None:
            loop.writer.close()
    log.info("%s: stopped after epoch %d (%s; best dev rsum %.2f at epoch %d)", role, prog.epoch,
             {"patience": f"no improvement for {optim.patience} epochs", "plateau": f"plateau {optim.plateaus}",
              "cap": f"the cap of {optim.epochs} epochs"}[state.stop], prog.best_rsum, prog.best_epoch)
    distributed.barrier()  # every rank returns after rank 0 has written the last files
    return result(already_finished=False)


def _distributed_model(model: JointModel, shard: distributed.Shard) -> torch.nn.Module:
    """``model`` itself for one process; under torchrun a ``DistributedDataParallel`` wrapper,
    which averages the gradients over the ranks during ``backward``. It syncs only what runs
    through its ``forward`` (``JointModel.forward``: both encoders), so steps call ``model(...)``
    once per batch rather than ``encode_images`` / ``encode_texts``. Batch-norm layers (vsrn, cnn)
    normalise each rank's local rows; the other encoders see no batch statistics."""
    if shard.world == 1:
        return model
    device = next(model.parameters()).device
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)


def optimise_step(step: StepFn, model: JointModel, batch: Any, optimizer: torch.optim.Optimizer,
                  params: list[Tensor], grad_clip: float) -> tuple[float, dict[str, float]]:
    """One optimisation step: loss, backward, gradient-norm clipping, optimiser update.

    Returns:
        The loss value and the step's stats.

    Raises:
        FloatingPointError: the loss is NaN or infinite (checked before the weights change).
    """
    loss, stats = step(model, batch)
    loss_value = float(loss.detach())
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"loss became {loss_value}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return loss_value, stats


@dataclass(kw_only=True)
class _Loop:
    """Everything one :func:`fit` call trains with; the mutable position lives in ``Progress``."""

    run_dir: Path
    cfg: ExperimentConfig
    optim: OptimConfig
    model: JointModel
    vocab: Vocabulary
    make_loader: MakeLoader
    step: StepFn
    validate: ValidateFn
    role: str
    extra: dict
    progress_bar: bool
    fingerprint: dict
    params: list[Tensor]
    optimizer: torch.optim.Optimizer
    shard: distributed.Shard
    net: torch.nn.Module  # what the step runs: the model, or its DDP wrapper
    writer: Any = None

    def save(self, prog: Progress) -> None:
        if not self.shard.is_main:
            return
        save_state(self.run_dir / "state", self.fingerprint, self.model, self.optimizer, prog)

    def _loader(self, prog: Progress) -> tuple[Iterable[Any], int | None]:
        """The rest of epoch ``prog.epoch`` and its total number of steps (None if unknown)."""
        generator = torch.Generator()
        if prog.step_in_epoch == 0:
            generator.manual_seed(epoch_seed(self.optim.seed, prog.epoch))
            prog.epoch_generator_state = generator.get_state()
        else:
            generator.set_state(prog.epoch_generator_state)
        loader = self.make_loader(prog.epoch, generator, prog.step_in_epoch)
        total = prog.step_in_epoch + len(loader) if isinstance(loader, Sized) else None
        cap = self.optim.max_steps_per_epoch
        if cap is not None:
            total = cap if total is None else min(total, cap)
        return loader, total

    def train_epoch(self, prog: Progress) -> None:
        """Finish epoch ``prog.epoch`` (from ``prog.step_in_epoch``), validate, checkpoint, log."""
        loader, total = self._loader(prog)
        lr = self.optimizer.param_groups[0]["lr"]
        self.model.train()
        epoch_start = time.perf_counter()
        bar = tqdm(total=total, initial=prog.step_in_epoch, unit="batch", leave=False, dynamic_ncols=True,
                   desc=f"{self.role} epoch {prog.epoch + 1}/{self.optim.epochs}",
                   disable=None if self.progress_bar else True)
        try:
            tick = time.perf_counter()
            for batch in loader:
                if total is not None and prog.step_in_epoch >= total:
                    break
                try:
                    loss, stats = optimise_step(self.step, self.net, batch, self.optimizer, self.params,
                                                self.optim.grad_clip)
                except FloatingPointError as exc:
                    raise FloatingPointError(f"{self.role}: {exc} at epoch {prog.epoch + 1}, step "
                                             f"{prog.step_in_epoch + 1}; lower the learning rate") from None
                prog.loss_sum += loss
                for key, value in stats.items():
                    prog.stat_sums[key] = prog.stat_sums.get(key, 0.0) + float(value)
                prog.pairs += _batch_size(batch) * self.shard.world
                prog.step_in_epoch += 1
                prog.global_step += 1
                now = time.perf_counter()
                prog.batch_time_sum += now - tick
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
                if prog.global_step % self.optim.save_every_steps == 0 and prog.step_in_epoch != total:
                    self.save(prog)
                tick = time.perf_counter()  # saving is not training time
        finally:
            bar.close()
        self._finish_epoch(prog, lr, time.perf_counter() - epoch_start)

    def _finish_epoch(self, prog: Progress, lr: float, train_time: float) -> None:
        """Validate, select, checkpoint, record why training stops (if it does), save the state, log.

        Under torchrun every rank validates (the same dev set, on its own device, so the ranks
        keep identical progress and pick the same best epoch) and rank 0 alone writes."""
        self.model.eval()
        val_start = time.perf_counter()
        with torch.no_grad():
            dev = self.validate(self.model)
        val_time = time.perf_counter() - val_start
        self.model.train()
        if "rsum" not in dev:
            raise ValueError(f"{self.role}: validate() must return 'rsum', got keys {sorted(dev)}")

        steps = max(prog.step_in_epoch, 1)
        rsum = float(dev["rsum"])
        is_best = rsum > prog.best_rsum
        record = {
            "epoch": prog.epoch + 1,
            "global_step": prog.global_step,
            "steps": prog.step_in_epoch,
            "lr": lr,
            "train_loss": prog.loss_sum / steps,
            **{f"train_{k}": v / steps for k, v in sorted(prog.stat_sums.items())},
            **_flatten(dev, "dev_"),
            "best": is_best,
            "train_time_s": train_time,
            "val_time_s": val_time,
            "batch_time_s": prog.batch_time_sum / steps,
            "pairs_per_s": prog.pairs / prog.batch_time_sum if prog.batch_time_sum > 0 else None,
        }
        prog.history.append(record)
        stop = budget_state([float(r["dev_rsum"]) for r in prog.history], self.optim).stop
        if stop is not None:
            record["stop"] = stop
        ckpt_extra = {"role": self.role, "epoch": prog.epoch + 1, "selected_on": "dev rsum", **self.extra}
        if is_best:
            prog.best_rsum, prog.best_epoch = rsum, prog.epoch + 1
            if self.shard.is_main:
                save_checkpoint(self.run_dir / "best", self.model, self.cfg, self.vocab, dev, ckpt_extra)
        if self.shard.is_main:
            save_checkpoint(self.run_dir / "last", self.model, self.cfg, self.vocab, dev, ckpt_extra)

        prog.epoch += 1
        prog.step_in_epoch = 0
        prog.epoch_generator_state = None
        prog.loss_sum, prog.stat_sums, prog.batch_time_sum, prog.pairs = 0.0, {}, 0.0, 0
        self.save(prog)
        if self.shard.is_main:
            _write_metrics_log(self.run_dir, prog.history)
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                    self.writer.add_scalar(f"{self.role}/{key}", value, record["epoch"])
            self.writer.flush()
        if self.shard.is_main:
            log.info("%s epoch %d/%d: loss %.4f, lr %.2g, dev rsum %.2f%s (%.1f s, %.1f ms/batch)", self.role,
                     record["epoch"], self.optim.epochs, record["train_loss"], lr, rsum, " *best*" if is_best else "",
                     train_time + val_time, 1000 * record["batch_time_s"])


def _batch_size(batch: Any) -> int:
    """Pairs in a batch: its ``caption_ids`` (one per positive pair: a round-2 batch stacks its
    offline items behind the positives in the other tensors), else the first dimension of its
    first tensor."""
    if isinstance(batch, dict):
        batch = batch["caption_ids"] if "caption_ids" in batch else next(iter(batch.values()))
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0]) if isinstance(batch, Tensor) else 0
