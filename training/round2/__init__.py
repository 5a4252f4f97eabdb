"""Round 2: a model trained with the offline hard negatives mined after round 1 (paper Eq. 3-5
and the Table 3 ablations): its batches, loss step and training run."""
