"""The run configuration: validation, overrides, clear errors."""

from pathlib import Path

import pytest

from aoq.config import ConfigError, config_from_dict, load_config, parse_override

ROOT = Path(__file__).resolve().parents[1]


# experiment configs; *_queries.yaml are the UI's example queries (tests/test_ui_examples.py)
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if not p.name.endswith("_queries.yaml")))
def test_shipped_configs_validate_and_round_trip(name):
    cfg = load_config(ROOT / "configs" / name)
    assert config_from_dict(cfg.model_dump(mode="json"), []) == cfg


def test_a_sampling_depth_beyond_the_mined_lists_is_refused(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("name: x\ndata: {path: d}\nmining: {top_captions: 100}\n")
    assert load_config(cfg_file, ["round2.h_t=100"]).round2.h_t == 100
    with pytest.raises(ConfigError, match="round2.h_t=101 exceeds mining.top_captions=100"):
        load_config(cfg_file, ["round2.h_t=101"])


def test_overrides_are_typed_and_nested(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("name: x\ndata: {path: d}\n")
    cfg = load_config(cfg_file, ["train.epochs=3", "model.bidirectional=true", "train.lr=1e-3", "name=y"])
    assert (cfg.train.epochs, cfg.model.bidirectional, cfg.train.lr, cfg.name) == (3, True, 1e-3, "y")
    assert cfg.run_dir == Path("runs/y")


def test_paper_defaults(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("data: {path: d}\n")
    r2 = load_config(cfg_file).round2
    assert (r2.margin_online, r2.margin_offline, r2.alpha, r2.beta, r2.h_t, r2.h_i) == (0.2, 0.0, 0.3, 1.5, 300, 60)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs=0", "train.epochs: Input should be greater than or equal to 1"),
        ("train.loss=hinge", "train.loss: Input should be"),
        ("train.nope=1", "train.nope: Extra inputs are not permitted"),
        ("round2.h_t=5000", "round2.h_t=5000 exceeds mining.top_captions=2000"),
    ],
)
def test_invalid_values_name_the_key(tmp_path, override, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("data: {path: d}\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg_file, [override])
    assert message in str(err.value)
    assert str(cfg_file) in str(err.value)


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not of the form"):
        parse_override("train.epochs")
