"""Caption encoder: learned word embeddings and a GRU, as in VSE++ and VSRN.

The GRU's hidden size is the joint-space size, so its final state *is* the projection into the
joint space (VSE++/VSRN have no separate projection layer either). Sequences are packed, so the
padding after a caption never changes its embedding; the token ids are packed before they are
embedded, so padding is neither embedded nor sorted. On CUDA the packed GRU is ``nn.GRU``
(cuDNN's fused kernels); elsewhere it is :mod:`aoq.models.packed_gru`, the same recurrence with
the same weights, about twice as fast on CPU for a training step.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from aoq.models.attention import l2norm
from aoq.models.packed_gru import packed_gru_final_states


class TextEncoder(nn.Module):
    """Token ids -> L2-normalised caption embeddings.

    Args:
        vocab_size: number of word ids (``<pad>`` = 0 is a regular, learned row).
        word_dim: word-embedding size (300 in the papers).
        embed_dim: joint-space size.
        num_layers: stacked GRU layers.
        bidirectional: run the GRU both ways and average the two directions' final states
            (VSRN averages the directions too).
    """

    def __init__(
        self,
        vocab_size: int,
        word_dim: int,
        embed_dim: int,
        num_layers: int = 1,
        bidirectional: bool = False,
    ) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(
            word_dim, embed_dim, num_layers=num_layers, batch_first=True, bidirectional=bidirectional
        )
        # VSE++ initialises word vectors uniformly in [-0.1, 0.1].
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Encode a padded batch.

        Args:
            tokens: (B, T) word ids, padded on the right.
            lengths: (B,) true lengths (>= 1), any order.

        Returns:
            (B, embed_dim) float tensor with unit L2 norm per row.
        """
        packed = pack_padded_sequence(tokens, lengths.detach().cpu().long(), batch_first=True, enforce_sorted=False)
        if tokens.is_cuda:
            _, h_n = self.rnn(packed._replace(data=self.embed(packed.data)))
            # h_n: (layers * directions, B, H); the last layer's state(s).
            last = list(h_n[-2:] if self.bidirectional else h_n[-1:])
        else:
            last = packed_gru_final_states(self.rnn, self.embed, packed)
        # For the backward direction the final state is the one after reading the whole caption
        # (from its end), which is why it is used rather than the output at the last time step.
        out = (last[0] + last[1]) / 2 if self.bidirectional else last[0]
        return F.normalize(out, dim=-1)


class WordEncoder(nn.Module):
    """Token ids -> one L2-normalised state per word (SCAN/BFAN's caption encoder).

    The GRU's output at each word; with ``bidirectional`` the two directions' outputs are
    averaged (the public code's ``--bi_gru``). Positions after a caption's length are zeros.
    Word vectors are initialised as in :class:`TextEncoder`.
    """

    def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, num_layers: int = 1,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_dim, num_layers=num_layers, batch_first=True,
                          bidirectional=bidirectional)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) padded word ids and (B,) lengths (>= 1) -> (B, T, embed_dim)."""
        packed = pack_padded_sequence(tokens, lengths.detach().cpu().long(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed._replace(data=self.embed(packed.data)))
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        if self.bidirectional:
            forward, backward = states.chunk(2, dim=-1)
            states = (forward + backward) / 2
        return l2norm(states, dim=-1)
