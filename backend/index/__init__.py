"""The index stage (``aoq index``): from checkpoints to FAISS index artefacts, the catalogue's
rows, the evaluation reports and the ground-truth ranks the service reads."""
