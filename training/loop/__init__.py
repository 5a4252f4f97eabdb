"""The generic, resumable training loop both rounds plug into: the loop itself, its state file,
the epoch's batches, the collapse guard and early stopping, and multi-process training."""
