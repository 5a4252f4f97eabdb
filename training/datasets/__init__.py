"""Dataset builders: each sub-package writes one dataset in the Karpathy + precomp layouts."""
