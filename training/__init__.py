"""Image-text retrieval trained with hard negatives (AOQ): library and the `aoq` command."""
