"""Batch-invariant query encoding (aoq.models.invariant) and the service's encoder batching: a text
encoded with any company of its token bucket, at any position, gets bit for bit the embedding it
gets alone (GRU one- and two-layer, one- and two-way; MiniLM); the embeddings agree with the
training path's within float rounding; concurrent encodes through aoq_serve.search.batching form batches
and answer exactly as alone."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from aoq.config import config_from_dict
from aoq.data.vocab import Vocabulary
from aoq.embed import encode_texts
from aoq.models.invariant import PerItemLinear, bucket_length, encode_bucket, query_text_encoder, rowwise
from aoq.models.joint import build_model, text_vocabulary
from aoq_serve.search import batching

CPU = torch.device("cpu")
WORDS = ("a small big red green blue circle square star ring on the left right top bottom and next to wall "
         "thumbs up dark skin tone flag of japan").split()


def _texts(n: int, seed: int) -> list[str]:
    """Texts of 1 to 20 words (several token buckets), with repeats."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(1, 21)))) for _ in range(n)]
    return texts + texts[:3]


def _gru(layers: int, bidirectional: bool):
    cfg = config_from_dict({"name": "t", "data": {"format": "precomp", "path": "unused"},
                            "model": {"embed_dim": 24, "word_dim": 12, "text_layers": layers,
                                      "bidirectional": bidirectional}})
    vocab = Vocabulary.build([" ".join(WORDS)])
    torch.manual_seed(layers + 2 * bidirectional)
    return build_model(cfg.model, len(vocab), 8).eval(), vocab


def _minilm():
    cfg = config_from_dict({"name": "t", "data": {"format": "karpathy", "path": "unused", "image_size": 224},
                            "model": {"image_encoder": "effnet_lite0", "text_encoder": "minilm", "embed_dim": 16}})
    torch.manual_seed(0)
    return build_model(cfg.model, 0, None).eval(), text_vocabulary(cfg.model, [], 1)


MODELS = {"gru": lambda: _gru(1, False), "gru-2-layers-both-ways": lambda: _gru(2, True), "minilm": _minilm}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_and_vocab(request):
    return MODELS[request.param]()


def test_bucket_length_always_leaves_padding():
    assert [bucket_length(n) for n in (1, 7, 8, 9, 15, 16, 17)] == [8, 8, 16, 16, 16, 24, 24]


@pytest.mark.parametrize("op", [torch.sigmoid, torch.tanh], ids=["sigmoid", "tanh"])
def test_rowwise_activations_round_each_row_alike_alone_and_in_a_batch(op, one_thread):
    """ATen finishes an elementwise op with a scalar tail whose sigmoid rounds differently (seen
    with AVX-512): a row's values must not depend on how many rows share its tensor."""
    x = torch.randn(9, 100, generator=torch.Generator().manual_seed(0))
    for width in (1, 12, 24, 48, 63, 64, 65, 100):
        rows = x[:, :width].contiguous()
        together = rowwise(op, rows)
        alone = torch.cat([rowwise(op, rows[i:i + 1].clone()) for i in range(len(rows))])
        assert torch.equal(together, alone), width
        torch.testing.assert_close(together, op(rows), atol=1e-6, rtol=0)


def test_a_text_encodes_alike_alone_and_in_any_company_of_its_bucket(model_and_vocab, one_thread):
    model, vocab = model_and_vocab
    encoder = query_text_encoder(model)
    sequences = [vocab.encode(t) for t in _texts(30, 0)]
    alone = [encode_bucket(encoder, [s], CPU)[0] for s in sequences]
    buckets: dict[int, list[int]] = {}
    for i, s in enumerate(sequences):
        buckets.setdefault(bucket_length(len(s)), []).append(i)
    assert max(len(members) for members in buckets.values()) >= 8, "the fixture must put many texts in one bucket"
    rng = np.random.default_rng(1)
    compared = 0
    for members in buckets.values():
        for _ in range(4):
            chosen = rng.permutation(members)[:int(rng.integers(1, len(members) + 1))]
            together = encode_bucket(encoder, [sequences[i] for i in chosen], CPU)
            for row, i in zip(together, chosen):
                assert np.array_equal(row, alone[i]), f"text {i} differs in company"
                compared += 1
    assert compared > len(sequences)
    # the same function as the training path, up to float rounding
    trained = encode_texts(model, vocab, _texts(30, 0))
    np.testing.assert_allclose(np.stack(alone), trained, atol=1e-6, rtol=0)


def test_encode_bucket_refuses_texts_of_different_buckets(model_and_vocab, one_thread):
    model, vocab = model_and_vocab
    with pytest.raises(ValueError, match="one bucket"):
        encode_bucket(query_text_encoder(model), [vocab.encode("a"), vocab.encode(" ".join(["red"] * 30))], CPU)


def test_minilm_linears_keep_their_parameters_and_state_keys():
    model, _ = _minilm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    query_text_encoder(model)
    linears = [m for m in model.text_encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is PerItemLinear for m in linears)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_concurrent_encodes_batch_and_answer_as_alone(monkeypatch, one_thread):
    model, vocab = _gru(1, False)
    encoder = query_text_encoder(model)
    sizes: list[int] = []

    def counted(encode, sequences, device):
        sizes.append(len(sequences))
        return encode_bucket(encode, sequences, device)

    monkeypatch.setattr(batching, "encode_bucket", counted)
    batching.set_batching(True)
    sequences = [vocab.encode(t) for t in _texts(48, 2)]
    alone = [encode_bucket(encoder, [s], CPU)[0] for s in sequences]
    start = threading.Barrier(len(sequences))

    def run(sequence):
        start.wait()
        return batching.encode(encoder, sequence, CPU)

    for _ in range(3):
        with ThreadPoolExecutor(len(sequences)) as pool:
            together = list(pool.map(run, sequences))
        assert all(np.array_equal(a, b) for a, b in zip(alone, together))
    assert max(sizes) > 1, "no batch formed: the test did not exercise batching"
    assert max(sizes) <= batching.MAX_BATCH
