"""Batch-invariant query encoding: a text's embedding does not depend on the texts encoded with it.

A search service that encodes concurrent queries together must give each query exactly the
answer it gets alone. Batching does not change the arithmetic of an encoder, but it changes the
*shapes* of its matrix products, and a CPU BLAS picks its kernel by shape: with the MKL of the
torch CPU build, the rows of a product with 1-3 rows round differently from the same rows inside a
larger product, and a caption GRU over a padded or packed batch runs its steps on as many rows as
sequences are still going. Embeddings then differ in the last bits, and so can the order of
nearly tied results.

Here every product a query's numbers go through has a shape fixed by that query alone:

- token sequences are padded to a bucket of their own length (:func:`bucket_length`: the next
  multiple of :data:`TOKEN_BUCKET` strictly above it, so a sequence always has padding and an
  attention mask is always applied), never to the longest sequence of the batch; texts of one
  bucket are encoded together;
- every linear layer multiplies each sequence's (bucket x in) block on its own, in one batched
  product (:func:`per_item_linear`): the same block shape whatever else is in the batch;
- the GRU runs every sequence for the bucket's steps, one row per sequence in each recurrent
  product, and keeps each sequence's state at its own last token (:func:`gru_final_states`);
  its gates' sigmoid and tanh run on rows padded to whole SIMD chunks (:func:`rowwise`).

Everything else the encoders do is row-wise (activations, layer norms, attention within one
sequence, masked mean pooling). ``tests/test_invariant_encoding.py`` checks the bitwise identity
on the GRU and MiniLM encoders, and that the embeddings agree with the training path's within
float rounding. The price: a lone query pays for its padding (at most one bucket), and a batch
forgoes the larger products a padded batch would use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aoq.data.loaders import PAD_ID
from aoq.models.joint import JointModel
from aoq.models.packed_gru import directions, layer_weights
from aoq.models.pretrained import MiniLMTextEncoder, mean_pool
from aoq.models.text import TextEncoder

#: token sequences are padded to the next multiple of this above their length.
TOKEN_BUCKET = 8
#: floats per chunk that covers whole SIMD vectors on every CPU torch targets (two AVX-512 vectors
#: are 32): ATen runs an elementwise op over the flattened tensor in vector chunks and finishes
#: with a scalar tail, and the tail's sigmoid rounds differently from the vector one, so a row
#: whose width is not a multiple of the chunk rounds by its place in the batch.
SIMD_CHUNK = 64

def bucket_length(length: int) -> int:
    """The padded length of a sequence of ``length`` tokens: the next multiple of
    :data:`TOKEN_BUCKET` strictly above it (always at least one padding position)."""
    return (length // TOKEN_BUCKET + 1) * TOKEN_BUCKET


def per_item_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` with each item of the leading dimension multiplied on its own: ``x`` (B, R, in)
    -> (B, R, out), one (R x in) @ (in x out) product per item, all in one batched call."""
    out = torch.bmm(x, weight.t().unsqueeze(0).expand(x.shape[0], -1, -1))
    return out if bias is None else out + bias


class PerItemLinear(nn.Linear):
    """An ``nn.Linear`` whose products never mix the items of a batch: a (B, T, in) input is
    multiplied one (T x in) sequence at a time, a (B, in) input one row at a time. The module's
    parameters and state are those of the ``nn.Linear`` it replaces (:func:`make_linears_per_item`)."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:
            return per_item_linear(x.unsqueeze(1), self.weight, self.bias).squeeze(1)
        lead = x.shape[:-2]
        out = per_item_linear(x.reshape(-1, *x.shape[-2:]), self.weight, self.bias)
        return out.reshape(*lead, *out.shape[-2:])


def make_linears_per_item(module: nn.Module) -> None:
    """Turn every ``nn.Linear`` inside ``module`` into a :class:`PerItemLinear`, in place: same
    parameters and state-dict keys, same function, batch-invariant products. Idempotent, so two
    threads doing it at once do no harm."""
    for child in module.modules():
        if type(child) is nn.Linear:
            child.__class__ = PerItemLinear


def _reverse_within(x: Tensor, lengths: Tensor) -> Tensor:
    """Each row's first ``length`` steps in reverse order, its padding left after them."""
    steps = torch.arange(x.shape[1], device=x.device)[None, :]
    index = torch.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[2]))


def rowwise(op: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``op`` (elementwise) of a (B, W) tensor, each row padded to a multiple of
    :data:`SIMD_CHUNK` so that every element takes the vector path, whatever B is."""
    pad = -x.shape[1] % SIMD_CHUNK
    return op(F.pad(x, (0, pad)))[:, :x.shape[1]] if pad else op(x)


def _direction(gates: Tensor, lengths: Tensor, w_hh: Tensor, b_hh: Tensor, keep_states: bool
               ) -> tuple[Tensor | None, Tensor]:
    """One GRU direction over precomputed input gates (B, T, 3H): every step's states (B, T, H; zero
    after a row's end; only with ``keep_states``) and each row's state after its own last token
    (B, H). The recurrence is ``torch.nn.GRU``'s; it stops at the batch's longest sequence, which
    changes no row (a row whose sequence has ended keeps its state)."""
    rows, width = gates.shape[:2]
    hidden = w_hh.shape[1]
    w_t = w_hh.t().unsqueeze(0).expand(rows, -1, -1)
    h = gates.new_zeros(rows, hidden)
    states = gates.new_zeros(rows, width, hidden) if keep_states else None
    for t in range(int(lengths.max())):
        i_rz, i_n = gates[:, t].split([2 * hidden, hidden], 1)
        h_rz, h_n = (torch.bmm(h.unsqueeze(1), w_t).squeeze(1) + b_hh).split([2 * hidden, hidden], 1)
        r, z = rowwise(torch.sigmoid, i_rz + h_rz).split(hidden, 1)
        n = rowwise(torch.tanh, i_n + r * h_n)
        h = torch.where((t < lengths)[:, None], (h - n) * z + n, h)
        if states is not None:
            states[:, t] = h
    return states, h


def gru_final_states(rnn: nn.GRU, embed: nn.Embedding, tokens: Tensor, lengths: Tensor) -> list[Tensor]:
    """The last layer's final states of ``rnn`` over padded ``tokens`` (B, T) of true ``lengths``,
    one (B, H) tensor per direction (forward first), as ``aoq.models.packed_gru`` gives them, each
    row computed by products of a shape fixed by T alone."""
    x = embed(tokens)
    finals: list[Tensor] = []
    for layer in range(rnn.num_layers):
        outputs, finals = [], []
        for suffix in directions(rnn):
            w_ih, b_ih, w_hh, b_hh = layer_weights(rnn, layer, suffix)
            reverse = suffix == "_reverse"
            seq = _reverse_within(x, lengths) if reverse else x
            last = layer + 1 == rnn.num_layers
            states, final = _direction(per_item_linear(seq, w_ih, b_ih), lengths, w_hh, b_hh, keep_states=not last)
            if states is not None:
                outputs.append(_reverse_within(states, lengths) if reverse else states)
            finals.append(final)
        if outputs:
            x = torch.cat(outputs, dim=2)
    return finals


def _gru_texts(encoder: TextEncoder) -> Callable[[Tensor, Tensor], Tensor]:
    def encode(tokens: Tensor, lengths: Tensor) -> Tensor:
        last = gru_final_states(encoder.rnn, encoder.embed, tokens, lengths)
        out = (last[0] + last[1]) / 2 if encoder.bidirectional else last[0]
        return F.normalize(out, dim=-1)
    return encode


def _minilm_texts(encoder: MiniLMTextEncoder) -> Callable[[Tensor, Tensor], Tensor]:
    make_linears_per_item(encoder)

    def encode(tokens: Tensor, lengths: Tensor) -> Tensor:
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        hidden = encoder.backbone(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        return F.normalize(encoder.head(mean_pool(hidden, mask)), dim=-1)
    return encode


def query_text_encoder(model: JointModel) -> Callable[[Tensor, Tensor], Tensor]:
    """The batch-invariant form of ``model``'s text encoder: (B, T) token ids padded to one bucket
    and (B,) lengths -> (B, d) unit rows. For a MiniLM encoder its linear layers become
    :class:`PerItemLinear` in place (same function and parameters).

    Raises:
        TypeError: an encoder with no batch-invariant form.
    """
    encoder = model.text_encoder
    if isinstance(encoder, TextEncoder):
        return _gru_texts(encoder)
    if isinstance(encoder, MiniLMTextEncoder):
        return _minilm_texts(encoder)
    raise TypeError(f"no batch-invariant query path for text encoder {type(encoder).__name__}")


def encode_bucket(encode: Callable[[Tensor, Tensor], Tensor], sequences: Sequence[Sequence[int]],
                  device: torch.device) -> np.ndarray:
    """Embed token sequences of one bucket together: (len(sequences), d) float32 rows, each equal
    to the row the sequence gets alone."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    width = bucket_length(int(lengths.max()))
    if any(bucket_length(len(s)) != width for s in sequences):
        raise ValueError("encode_bucket: the sequences are not all of one bucket")
    tokens = torch.full((len(sequences), width), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(sequences):
        tokens[row, :len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    with torch.inference_mode():
        return encode(tokens.to(device), lengths.to(device)).float().cpu().numpy()
