"""Queries to vectors: text through the model's vocabulary and text encoder, uploaded images
through the model's own image path.

Text: a ``gru`` model maps words outside its training vocabulary to ``<unk>``; a ``minilm``
model's vocabulary is the pretrained WordPiece tokenizer, so any free text is encoded. Queries go
through the batch-invariant form of the text encoder (:mod:`aoq.models.invariant`), so a query
encoded together with concurrent ones (:mod:`aoq_serve.search.batching`) gets the embedding it gets alone.

Image paths by model kind:

- raw-image models (``image_input == "pixels"``, the cnn encoders): ``load_pixels`` at the
  training image size, then the CNN;
- pretrained EfficientNet-Lite0 (``effnet_lite0``, also ``"pixels"``): any PNG/JPEG, at the
  backbone's own input size (224), through the backbone and the trained projection head;
- region-feature models on the synthetic benchmark: the benchmark's own pixel region extractor
  (``extract_regions``), the very function that produced the training features;
- region-feature models on COCO/Flickr30K precomp: those features came from an external
  detector (bottom-up attention) that is not part of this project, so an upload is refused
  with a 422 that says so.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from aoq.checkpoint import Checkpoint
from aoq.data.loaders import load_pixels
from aoq.embed import encode_image_inputs
from aoq.features import extract_regions
from aoq.models.invariant import query_text_encoder
from aoq.models.joint import JointModel
from aoq_serve.errors import ServiceError
from aoq_serve.search import batching

_making = threading.Lock()
#: each served model's batch-invariant text encoder and device, made on its first query.
_encoders: weakref.WeakKeyDictionary[JointModel, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                                                       torch.device]] = weakref.WeakKeyDictionary()


def _query_encoder(model: JointModel) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], torch.device]:
    with _making:
        made = _encoders.get(model)
        if made is None:
            made = _encoders[model] = (query_text_encoder(model), next(model.parameters()).device)
        return made


def encode_text(checkpoint: Checkpoint, text: str) -> np.ndarray:
    """One query's unit-norm embedding, shape (d,): the same whether it is encoded alone or
    batched with concurrent queries."""
    encoder, device = _query_encoder(checkpoint.model)
    return batching.encode(encoder, checkpoint.vocab.encode(text), device)


def upload_refusal(image_input: str, synthetic: bool, dataset: str) -> str | None:
    """Why uploads cannot be featurised for a model, or None when they can."""
    if image_input == "pixels" or synthetic:
        return None
    return (
        f"this model reads region features of dataset {dataset!r} that came from an external detector "
        f"(bottom-up attention), which this service does not run; query by image_id instead"
    )


def encode_upload(checkpoint: Checkpoint, image: Image.Image, synthetic: bool, dataset: str) -> np.ndarray:
    """Embed an uploaded image with the model's own image path, shape (d,).

    Raises:
        ServiceError: 422 for feature models of a dataset whose features the service cannot compute.
    """
    model = checkpoint.model
    refusal = upload_refusal(model.image_input, synthetic, dataset)
    if refusal is not None:
        raise ServiceError(422, refusal)
    if model.image_input == "pixels":
        # A pretrained backbone reads its own input size; the CNNs the training image size.
        size = getattr(model.image_encoder, "input_size", checkpoint.config.data.image_size)
        inputs = load_pixels(image, size)[None]
    else:
        inputs = torch.from_numpy(extract_regions(image))[None]
    return encode_image_inputs(model, inputs)[0]
