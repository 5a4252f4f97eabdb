"""Image-text retrieval trained with hard negatives (AOQ): the core library.

Models, tokeniser and vocabulary, checkpoints, embedding, metrics, artefact I/O, configuration and
dataset readers. The training app (``training``) and the search service (``backend``) import it;
the ``aoq`` command lives in ``aoq_cli``, which no library module imports.
"""
