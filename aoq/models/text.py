"""Caption encoder: learned word embeddings and a GRU, as in VSE++ and VSRN.

The GRU's hidden size is the joint-space size, so its final state *is* the projection into the
joint space (VSE++/VSRN have no separate projection layer either). Sequences are packed, so the
padding after a caption never changes its embedding.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence


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
        x = self.embed(tokens)
        packed = pack_padded_sequence(x, lengths.detach().cpu().long(), batch_first=True, enforce_sorted=False)
        _, h_n = self.rnn(packed)
        # h_n: (layers * directions, B, H); keep the last layer's state(s). For the backward
        # direction this is the state after reading the whole caption (from its end), which is
        # why it is used rather than the output at the last time step.
        if self.bidirectional:
            out = (h_n[-2] + h_n[-1]) / 2
        else:
            out = h_n[-1]
        return F.normalize(out, dim=-1)
