"""Checks the trainer runs after every epoch: the collapse guard and early stopping.

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

Early stopping (``patience``): stop once dev rsum has not improved for ``patience`` epochs;
``epochs`` is then the cap. Both read only the metrics log, so a resumed run decides the same.
"""

from __future__ import annotations

from typing import Any

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


def plateaued(best_epoch: int, epochs_done: int, patience: int | None) -> bool:
    """True when early stopping applies: ``patience`` epochs since the best dev rsum."""
    return patience is not None and epochs_done > 0 and epochs_done - best_epoch >= patience
