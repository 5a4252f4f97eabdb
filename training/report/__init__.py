"""``aoq report``: paired seeds of the pipeline (runs), their tables and statistics, figures,
within-family recall, and the results page written from the run files."""
