"""Tokenizer, vocabulary and the ``aoq vocab`` command."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from aoq_cli.main import main as aoq
from aoq.data.precomp import read_captions
from aoq.data.vocab import (
    TOKENIZER_VERSION,
    Vocabulary,
    coverage,
    format_coverage,
    tokenize,
)
from aoq.io import ArtefactError
from tests.fixtures import fixture_captions, write_precomp_fixture


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("A man riding a wave on top of a surfboard.",
         ["a", "man", "riding", "a", "wave", "on", "top", "of", "a", "surfboard"]),
        ("Two dogs playing in the snow .", ["two", "dogs", "playing", "in", "the", "snow"]),
        ("  A   cat\tsits on\u00a0a mat \n", ["a", "cat", "sits", "on", "a", "mat"]),
        ("A man's board, isn't it?", ["a", "man", "'s", "board", "is", "n't", "it"]),
        ("The dog\u2019s toy; they can\u2019t reach it", ["the", "dog", "'s", "toy", "they", "ca", "n't", "reach", "it"]),
        ("The players' bench", ["the", "players", "bench"]),
        ("Ein Hund läuft über die Straße", ["ein", "hund", "läuft", "über", "die", "straße"]),
        ("Cafe\u0301 CRÈME", ["café", "crème"]),
        ("3.5 pizzas and 1,000 birds on 2 wires", ["3.5", "pizzas", "and", "1,000", "birds", "on", "2", "wires"]),
        ("A black-and-white photo of a 4x4 truck", ["a", "black", "and", "white", "photo", "of", "a", "4x4", "truck"]),
        ("\u201cQuoted\u201d (words) -- here!", ["quoted", "words", "here"]),
        # Symbols are tokens of their own (tokenizer aoq-regex-2); text never yields a special token.
        ("<unk> <pad>", ["<", "unk", ">", "<", "pad", ">"]),
        ("keycap: #", ["keycap", "#"]),
        ("keycap: *", ["keycap", "*"]),
        ("+1, thumbs up; − sign", ["+", "1", "thumbs", "up", "−", "sign"]),
        ("5 × 3 = 15 ✓, costs $3!", ["5", "×", "3", "=", "15", "✓", "costs", "$", "3"]),
        ("", []),
        ("...", []),
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_keycaps_hash_and_star_are_different_captions() -> None:
    vocab = Vocabulary.build(["keycap: #", "keycap: *"], threshold=1)
    assert vocab.encode("keycap: #") != vocab.encode("keycap: *")


def test_coverage_counts_unknown_tokens_and_entirely_unknown_captions() -> None:
    vocab = Vocabulary.build(["a dog", "a cat"], threshold=1)  # words: a, dog, cat
    cov = coverage(vocab, ["a dog", "a bird", "red bird", "..."])
    # tokens: 2 + 2 + 2 + 0 = 6; unknown: bird, red, bird; "red bird" and the token-less "..." are blind
    assert cov == {
        "tokens": 6,
        "unknown_tokens": 3,
        "unknown_token_share": 0.5,
        "captions": 4,
        "unknown_captions": 2,
        "unknown_caption_share": 0.5,
    }
    assert format_coverage(cov) == "50.00% of 6 caption tokens unknown; 50.00% of 4 captions entirely unknown"


def test_build_logs_the_share_of_training_tokens_below_the_threshold(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="aoq.data.vocab"):
        Vocabulary.build(["a dog", "a cat", "a dog"], threshold=2)  # kept a (3), dog (2); cat (1) of 6
    assert "16.67% of the 6 training tokens fall below the threshold" in caplog.text


def test_tokenize_ignores_trailing_punctuation_style() -> None:
    assert tokenize("Two dogs playing in the snow.") == tokenize("two dogs playing in the snow .\n")


CAPTIONS = [
    "A dog on a bed.",
    "A dog on the grass.",
    "a cat on a bed",
    "A DOG runs.",
    "The cat sleeps.",
]  # counts: a=5, dog=3, on=3, bed=2, cat=2, the=2, grass/runs/sleeps=1


def test_build_threshold_and_order() -> None:
    vocab = Vocabulary.build(CAPTIONS, threshold=2)
    assert vocab.words == ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "on", "bed", "cat", "the"]
    assert vocab.threshold == 2
    assert len(vocab) == 10
    assert "grass" not in vocab and "dog" in vocab


def test_build_does_not_depend_on_caption_order() -> None:
    assert Vocabulary.build(CAPTIONS, 1).words == Vocabulary.build(reversed(CAPTIONS), 1).words


def test_build_vsepp_threshold_default() -> None:
    vocab = Vocabulary.build(CAPTIONS)
    assert vocab.threshold == 4
    assert vocab.words[4:] == ["a"]


def test_build_rejects_bad_threshold() -> None:
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        Vocabulary.build(CAPTIONS, threshold=0)


def test_encode_decode() -> None:
    vocab = Vocabulary.build(CAPTIONS, threshold=2)
    ids = vocab.encode("A dog on the moon!")
    assert ids == [1, 4, 5, 6, 9, 3, 2]
    assert vocab.decode(ids) == "a dog on the <unk>"
    assert vocab.decode([1, 5, 2, 0, 0]) == "dog"
    assert vocab.encode("") == [1, 2]
    assert vocab.token_id("cat") == 8 and vocab.token_id("zebra") == 3


def test_save_load_roundtrip(tmp_path: Path) -> None:
    vocab = Vocabulary.build(CAPTIONS, threshold=2)
    path = vocab.save(tmp_path / "sub" / "vocab.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == {"kind": "aoq-vocabulary", "tokenizer": TOKENIZER_VERSION, "threshold": 2, "words": vocab.words}
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.threshold == 2
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp file left behind


def test_unicode_words_survive_save_load(tmp_path: Path) -> None:
    vocab = Vocabulary.build(["ein café", "ein café"], threshold=2)
    assert Vocabulary.load(vocab.save(tmp_path / "v.json")).encode("Café") == [1, vocab.token_id("café"), 2]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "vocabulary is not valid JSON"),
        ('{"words": ["<pad>"]}', "not an AOQ vocabulary"),
        ('[1, 2]', "not an AOQ vocabulary"),
        ('{"kind": "aoq-vocabulary", "tokenizer": "nltk", "words": []}', "built with tokenizer 'nltk'"),
        (f'{{"kind": "aoq-vocabulary", "tokenizer": "{TOKENIZER_VERSION}", "words": "abc"}}',
         '"words" must be a list of non-empty strings'),
        (f'{{"kind": "aoq-vocabulary", "tokenizer": "{TOKENIZER_VERSION}", "words": ["<pad>", 3]}}',
         '"words" must be a list of non-empty strings'),
        (f'{{"kind": "aoq-vocabulary", "tokenizer": "{TOKENIZER_VERSION}", "words": ["a", "<pad>", "<start>", "<end>"]}}',
         "the first words must be"),
        (f'{{"kind": "aoq-vocabulary", "tokenizer": "{TOKENIZER_VERSION}", '
         f'"words": ["<pad>", "<start>", "<end>", "<unk>", "dog", "cat", "dog"]}}', "duplicate words ['dog']"),
        (f'{{"kind": "aoq-vocabulary", "tokenizer": "{TOKENIZER_VERSION}", "threshold": 0, '
         f'"words": ["<pad>", "<start>", "<end>", "<unk>"]}}', '"threshold" must be a positive integer'),
    ],
)
def test_load_rejects_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ArtefactError) as err:
        Vocabulary.load(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ArtefactError, match="vocab.json: vocabulary file not found"):
        Vocabulary.load(tmp_path / "vocab.json")


def _config(tmp_path: Path, data_path: Path) -> Path:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(f"name: t\ndata:\n  format: precomp\n  path: {data_path}\n", encoding="utf-8")
    return cfg


def test_vocab_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_precomp_fixture(tmp_path, splits={"train": 6, "dev": 2, "test": 2})
    dev_caps = data / "dev_caps.txt"  # a word only the dev split has must not enter the vocabulary
    dev_caps.write_text(dev_caps.read_text(encoding="utf-8").replace("picture", "zebra"), encoding="utf-8")
    out = tmp_path / "out" / "vocab.json"
    code = aoq(["vocab", "--config", str(_config(tmp_path, data)), "--set", "data.vocab_threshold=3",
                "--out", str(out)])
    assert code == 0
    expected = Vocabulary.build(fixture_captions("train", 6), threshold=3)
    assert Vocabulary.load(out) == expected and expected.threshold == 3
    assert "picture" in expected and "zebra" not in expected
    printed = capsys.readouterr().out
    assert f"{out}: {len(expected)} tokens (threshold 3) from 30 captions" in printed
    dev_coverage = coverage(expected, read_captions(dev_caps))
    assert dev_coverage["unknown_tokens"] >= 2  # at least the zebras
    assert f"  dev: {format_coverage(dev_coverage)}\n" in printed
    assert f"  test: {format_coverage(coverage(expected, read_captions(data / 'test_caps.txt')))}\n" in printed


def test_vocab_command_reports_data_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    code = aoq(["vocab", "--config", str(_config(tmp_path, missing)), "--out", str(tmp_path / "v.json")])
    assert code == 2
    assert f"aoq vocab: error: {missing}: precomp folder not found" in capsys.readouterr().err
    assert not (tmp_path / "v.json").exists()
