"""A deployment's config as a YAML path (under the allowed roots) instead of the form's config object."""

import pytest

from flows.round import resolve_round_config, rlhf_round, rlhf_rounds
from rlhf_core.config import ConfigError, RoundConfig
from rlhf_core.paths import PathNotAllowedError


def _write(path, text):
    path.write_text(text)
    return path


def test_a_config_path_loads_the_file_with_the_round_defaults_under_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "r.yaml", "name: weekly\nseed: 7\nppo: {iterations: 70}\n")
    cfg = resolve_round_config(RoundConfig(), "r.yaml")  # relative to the worker's directory
    assert (cfg.name, cfg.seed, cfg.ppo.iterations) == ("weekly", 7, 70)
    assert cfg.ppo.policy_lr == RoundConfig().ppo.policy_lr  # a key the file leaves out keeps the round's value
    assert resolve_round_config(RoundConfig(seed=3), None).seed == 3  # no path: the form's config


def test_a_changed_form_and_a_config_path_together_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "r.yaml", "seed: 7\n")
    with pytest.raises(ConfigError, match="either as config_path .* or in the form's config, not both"):
        resolve_round_config(RoundConfig(seed=3), "r.yaml")
    with pytest.raises(ConfigError, match="not both"):  # the flows refuse it before any work
        rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path / "w"), seed=3), config_path="r.yaml")
    with pytest.raises(ConfigError, match="not both"):
        rlhf_rounds.fn(config=RoundConfig(seed=3), config_path="r.yaml")
    assert not (tmp_path / "w").exists()


def test_an_invalid_missing_or_outside_config_path_is_one_clear_error(tmp_path, monkeypatch):
    inside, outside = tmp_path / "project", tmp_path / "elsewhere"
    inside.mkdir(), outside.mkdir()
    monkeypatch.chdir(inside)
    monkeypatch.delenv("RLHF_ALLOWED_ROOTS", raising=False)
    _write(inside / "bad.yaml", "ppo: {kl_coeff: 0.1}\n")
    with pytest.raises(ConfigError, match=r"ppo\.kl_coeff: unknown key"):
        rlhf_round.fn(config_path="bad.yaml")
    with pytest.raises(PathNotAllowedError, match="config_path: missing.yaml does not exist"):
        resolve_round_config(RoundConfig(), "missing.yaml")
    _write(outside / "r.yaml", "seed: 1\n")
    with pytest.raises(PathNotAllowedError, match="config_path: .* outside the allowed roots"):
        resolve_round_config(RoundConfig(), str(outside / "r.yaml"))
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(outside))
    assert resolve_round_config(RoundConfig(), str(outside / "r.yaml")).seed == 1
