"""A GRU over packed captions, computed step by step with ``nn.GRU``'s own weights and operations.

Why not call ``nn.GRU`` on CPU: its packed-sequence loop slices each time step out of the
precomputed input gates with ``narrow``, whose gradient is a zero-filled copy of *all* the
input gates, and autograd adds these T full-size copies together: the backward pass does
O(T x tokens) memory work for an O(tokens) result. Here the steps are split apart once
(gradient: one concatenation). With the measures below, the forward and backward pass of the
synthetic config's caption GRU takes 0.53x ``nn.GRU``'s CPU time for 128 captions and 0.33x
for 384 (one thread; docs/training.md, Speed).

The input gates of the first layer, ``W_ih embed(token) + b_ih``, depend on the token alone, so
they are computed once per distinct token of the batch and gathered, rather than once per
position: the word vectors of a caption batch repeat a lot (a vocabulary of hundreds to a few
thousand words, thousands of positions per batch).

The recurrence is the one of ``torch.nn.GRU`` (and of ATen's CPU cell, operation for operation,
with the hidden product cut in two)::

    r = sigmoid(W_hr h + b_hr + W_ir x + b_ir)
    z = sigmoid(W_hz h + b_hz + W_iz x + b_iz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (h - n) * z + n

so the embeddings are those of ``nn.GRU`` on the same packed input, up to the rounding of the
matrix products and of the gradient sums (tests/test_models.py checks values and gradients
against it in float64, with layers and both directions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence


def _cell(gates_in: Tensor, h: Tensor, w_rz: Tensor, b_rz: Tensor, w_n: Tensor, b_n: Tensor) -> Tensor:
    """One GRU step from precomputed input gates (rows, 3H) and the state (rows, H), with the
    hidden weights and biases of the reset and update gates (``w_rz``, ``b_rz``: 2H rows) apart
    from those of the new gate (``w_n``, ``b_n``).

    Allocations and memory traffic are much of a step's cost on CPU, so: the two products are
    computed apart, so that what the backward pass keeps of them is the (rows, H) new-gate part,
    not all three gates; the reset and update gates share one addition and one sigmoid; tensors
    are cut with ``split`` (its gradient is one concatenation; a slice's is a zero-filled tensor
    of the whole); and results are updated in place where autograd keeps no copy of what is
    overwritten."""
    hidden = h.shape[1]
    i_rz, i_n = gates_in.split([2 * hidden, hidden], 1)
    r, z = (F.linear(h, w_rz, b_rz) + i_rz).sigmoid_().split(hidden, 1)
    n = (i_n + F.linear(h, w_n, b_n) * r).tanh_()
    return ((h - n) * z).add_(n)


def _direction(steps: list[Tensor], w_hh: Tensor, b_hh: Tensor, reverse: bool) -> tuple[list[Tensor], Tensor]:
    """One direction of one layer over the input gates of each packed step (``steps[t]``:
    (rows_t, 3H), rows_t non-increasing): the outputs of the steps in step order (each
    (rows_t, H)) and the final states (B, H), rows in the packed (length-sorted) order. The
    forward direction drops the rows whose sequence has ended; the reverse one starts from the
    last step and takes rows in as their sequences begin."""
    sizes = [s.shape[0] for s in steps]
    hidden = w_hh.shape[1]
    w_rz, w_n = w_hh.split([2 * hidden, hidden])
    b_rz, b_n = b_hh.split([2 * hidden, hidden])
    outputs: list[Tensor] = []
    ended: list[Tensor] = []
    h = w_hh.new_zeros(sizes[-1] if reverse else sizes[0], hidden)  # as nn.GRU: in the weights' dtype
    for t in (reversed(range(len(sizes))) if reverse else range(len(sizes))):
        rows = sizes[t]
        if h.shape[0] < rows:
            h = torch.cat([h, h.new_zeros(rows - h.shape[0], hidden)])
        elif h.shape[0] > rows:
            h, done = h.split([rows, h.shape[0] - rows])
            ended.append(done)
        h = _cell(steps[t], h, w_rz, b_rz, w_n, b_n)
        outputs.append(h)
    if reverse:
        return outputs[::-1], h
    # The longest sequences end last; their rows come first in the packed order.
    return outputs, torch.cat([h, *reversed(ended)])


def directions(rnn: nn.GRU) -> tuple[str, ...]:
    """The parameter-name suffixes of ``rnn``'s directions, forward first."""
    return ("", "_reverse") if rnn.bidirectional else ("",)


def layer_weights(rnn: nn.GRU, layer: int, suffix: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(weight_ih, bias_ih, weight_hh, bias_hh)`` of one layer and direction of ``rnn``."""
    w_ih, b_ih, w_hh, b_hh = (getattr(rnn, f"{name}_l{layer}{suffix}")
                              for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh"))
    return w_ih, b_ih, w_hh, b_hh


def packed_gru_final_states(rnn: nn.GRU, embed: nn.Embedding, tokens: PackedSequence) -> list[Tensor]:
    """The last layer's final states of ``rnn`` over the embedded packed ``tokens``, one (B, H)
    tensor per direction (forward first), rows in the caller's (unsorted) order: the last
    layer's entries of ``rnn(packed embeddings)[1]``.

    Raises:
        ValueError: ``rnn`` would apply dropout between its layers (train mode, dropout > 0).
    """
    if rnn.dropout and rnn.training:
        raise ValueError("packed_gru_final_states does not apply nn.GRU's inter-layer dropout")
    sizes = tokens.batch_sizes.tolist()
    distinct, where = torch.unique(tokens.data, return_inverse=True)
    words = embed(distinct)
    where_steps = where.split(sizes)
    x: Tensor | None = None  # the packed outputs of the layer below
    finals: list[Tensor] = []
    for layer in range(rnn.num_layers):
        outputs, finals = [], []
        for suffix in directions(rnn):
            w_ih, b_ih, w_hh, b_hh = layer_weights(rnn, layer, suffix)
            if x is None:
                table = F.linear(words, w_ih, b_ih)
                gates = [F.embedding(w, table) for w in where_steps]  # its gradient: faster than index_select's
            else:
                gates = list(F.linear(x, w_ih, b_ih).split(sizes))
            steps, final = _direction(gates, w_hh, b_hh, reverse=suffix == "_reverse")
            outputs.append(steps)
            finals.append(final)
        if layer + 1 < rnn.num_layers:
            x = torch.cat([torch.cat(steps) for steps in outputs], dim=1)
    order = tokens.unsorted_indices
    return [f if order is None else f.index_select(0, order) for f in finals]
