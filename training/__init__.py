"""The training app (installed as ``aoq_train``): the two rounds of AOQ and everything around them.

Read the folders in the order the data flows::

    datasets/    build a dataset (the synthetic benchmark, the emoji pictures)
    objectives/  the losses on score tensors (paper Eq. 1-5, GOAL, the label term)
    loop/        the generic, resumable training loop (state, batches, guards, torchrun)
    round1.py    round 1: the baseline, trained with an in-batch loss
    mining/      offline hard negatives mined with the round-1 model, and how round 2 draws them
    round2/      round 2: AOQ and its ablations, trained with the mined negatives
    evaluate.py  a checkpoint evaluated under a retrieval protocol
    pipeline/    the rounds as hashed, resumable stages, and the arms compared with the baseline
    report/      paired seeds of the pipeline turned into a results page

It imports the core library (``aoq``) and nothing of the service, the UI or the command.
"""
