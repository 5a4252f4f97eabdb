"""What a request computes on the served models: queries to vectors (``featurize``, uploads
through ``decode``), the two searches (``engine``) over the gallery's scopes (``gallery``) with the
correct answers (``truth``), concurrent work batched (``batching``), and the analyses of a pair of
models: hard negatives (``negatives``) and failure cases (``failures``)."""
