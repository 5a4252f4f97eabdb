"""Command modules of the `aoq` CLI (see training/cli.py)."""
