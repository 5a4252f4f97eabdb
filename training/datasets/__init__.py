"""Dataset builders: the synthetic benchmark generator."""
