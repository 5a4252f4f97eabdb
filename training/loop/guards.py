"""Checks the trainer runs after every epoch: the collapse guard and the training budget.

Collapse guard (``collapse_epochs``): an epoch *looks collapsed* when

* the dev set is large enough for chance to be told apart (chance rsum, the expected rsum of
  random scores from :func:`aoq.metrics.chance_rsum`, at most 100: about 32 images or more) and
  its dev rsum is at most twice chance; or
* the dev set is smaller and the mean positive and hardest-negative training scores are equal
  within 0.01 (every item embedded to about the same point; with max_violation the loss then
  sits at 2 x margin x batch). On a large dev set this alone is not enough: a healthy run passes
  through equal means once, while its positives overtake the negatives, with dev recall far
  above chance.

After ``collapse_epochs`` such epochs in a row, :class:`TrainingCollapsed` stops the run, before
anything downstream (mining, round 2) reads its checkpoints.

The budget (:func:`budget_state`), from the dev rsum of the epochs so far:

* ``schedule: step``: the learning rate drops every ``lr_decay_epochs`` epochs; with ``patience``
  training stops once dev rsum has not improved for that many epochs (stop ``"patience"``);
* ``schedule: plateau``: a *plateau* is ``patience`` epochs without a new best dev rsum, counted
  from the later of the best epoch and the last drop; each of the first ``plateaus - 1`` plateaus
  drops the learning rate, the next one ends training (stop ``"plateau"``), so every run trains
  to its own plateau however fast it learns;
* either way ``epochs`` is the cap (stop ``"cap"``): a run stopped there may not have converged,
  and the report flags it.

Both read only the metrics log, so a resumed run decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: |mean positive - mean hardest negative| below this counts as "equal" (scores lie in [-1, 1]).
EQUAL_SCORES = 0.01
#: dev sets whose chance rsum is above this are too small for the chance test.
MAX_CHANCE_RSUM = 100.0
#: dev rsum at most this many times chance counts as "at chance".
CHANCE_FACTOR = 2.0


class TrainingCollapsed(RuntimeError):
    """A run collapsed (dev recall at chance, or positives scored like the hardest negatives)."""


def collapse_reason(record: dict[str, Any]) -> str | None:
    """Why one epoch's metrics record looks collapsed (module docstring), or None."""
    chance = record.get("dev_chance_rsum")
    if chance is not None and chance <= MAX_CHANCE_RSUM:
        rsum = record["dev_rsum"]
        if rsum <= CHANCE_FACTOR * chance:
            return f"dev rsum {rsum:.2f} at chance (chance {chance:.2f})"
        return None
    pos, neg = record.get("train_pos"), record.get("train_hardest_neg")
    if pos is not None and neg is not None and abs(pos - neg) < EQUAL_SCORES:
        return f"positive and hardest-negative scores equal ({pos:.4f} vs {neg:.4f})"
    return None


def check_collapse(history: list[dict[str, Any]], epochs: int, role: str, optim: Any) -> None:
    """Raise :class:`TrainingCollapsed` when the last ``epochs`` records all look collapsed.

    Args:
        history: the metrics records so far (one per epoch).
        epochs: ``collapse_epochs``; 0 turns the guard off.
        optim: the round's config section (its lr, batch size and margin go into the message).
    """
    if epochs < 1 or len(history) < epochs:
        return
    reasons = [collapse_reason(r) for r in history[-epochs:]]
    if not all(reasons):
        return
    last = history[-1]
    margin = getattr(optim, "margin", getattr(optim, "margin_online", None))
    loss_note = ""
    if margin is not None:
        loss_note = (f" With a max-violation hinge such a model's loss sits at 2 x margin x batch = "
                     f"{2 * margin * optim.batch_size:g} (last epoch: {last['train_loss']:.4g}).")
    raise TrainingCollapsed(
        f"{role} collapsed: {reasons[-1]} for {epochs} epoch(s) in a row (to epoch {last['epoch']}). "
        f"The model embeds every image and caption to about the same point, so its scores carry no "
        f"ranking and nothing should be mined or compared from it.{loss_note} Try a lower learning rate "
        f"(lr is {optim.lr:g}; e.g. {optim.lr / 10:g}), then rerun: the changed config starts this stage "
        "afresh (collapse_epochs=0 turns the guard off)."
    )


Stop = Literal["patience", "plateau", "cap"]


@dataclass(frozen=True)
class BudgetState:
    """Where a run stands in its budget after the epochs of a metrics log: the learning-rate drops
    so far (the next epoch trains at ``lr * lr_decay_factor ** lr_drops``) and why training stops
    now, or None to go on."""

    lr_drops: int
    stop: Stop | None


def budget_state(dev_rsums: list[float], optim: Any) -> BudgetState:
    """The budget after epochs with these dev rsums (module docstring); ``optim`` is the round's
    config section (``schedule``, ``patience``, ``plateaus``, ``lr_decay_epochs``, ``epochs``)."""
    epochs = len(dev_rsums)
    if optim.schedule == "step":
        best = max(range(epochs), key=lambda e: dev_rsums[e], default=-1) + 1  # first best, 1-based
        if optim.patience is not None and epochs > 0 and epochs - best >= optim.patience:
            return BudgetState(epochs // optim.lr_decay_epochs, "patience")
        return BudgetState(epochs // optim.lr_decay_epochs, "cap" if epochs >= optim.epochs else None)
    best, since, drops = float("-inf"), 0, 0
    for rsum in dev_rsums:
        if rsum > best:
            best, since = rsum, 0
        else:
            since += 1
        if since >= optim.patience:
            if drops + 1 == optim.plateaus:
                return BudgetState(drops, "plateau")
            drops, since = drops + 1, 0
    return BudgetState(drops, "cap" if epochs >= optim.epochs else None)
