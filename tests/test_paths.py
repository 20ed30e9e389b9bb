"""Config paths resolve under the allowed roots: no `..` or symlink escapes; the message says how to allow."""

import os
import re

import pytest

from rlhf_core.config import parse_config
from rlhf_core.paths import PathNotAllowedError, allowed_roots, check_config_paths, resolve_allowed


@pytest.fixture
def layout(tmp_path, monkeypatch):
    (tmp_path / "project" / "data").mkdir(parents=True)
    (tmp_path / "project" / "data" / "ok.json").write_text("[]")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.delenv("RLHF_ALLOWED_ROOTS", raising=False)
    return tmp_path


def test_paths_under_the_cwd_or_workdir_resolve(layout):
    roots = allowed_roots(layout / "runs")
    assert resolve_allowed("data/ok.json", "annotation.exports[0]", roots) == layout / "project" / "data" / "ok.json"
    assert resolve_allowed("data/../data/ok.json", "k", roots).name == "ok.json"


def test_the_workdir_is_a_root_only_inside_the_allowed_ones(layout, monkeypatch):
    """The workdir is itself a value of the config (a Prefect form): `workdir: /` allowed every file, /etc included."""
    config = parse_config({"workdir": "/", "annotation": {"exports": [str(layout / "secret" / "key.json")]}})
    with pytest.raises(PathNotAllowedError, match=r"annotation.exports\[0\]: .*key.json.* outside the allowed roots"):
        check_config_paths(config)
    assert allowed_roots(layout / "project" / "runs")[-1] == layout / "project" / "runs"  # under the cwd: a root
    assert allowed_roots(layout / "elsewhere") == [layout / "project"]
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(layout))  # under RLHF_ALLOWED_ROOTS: a root again
    assert allowed_roots(layout / "elsewhere")[-1] == layout / "elsewhere"


def test_dotdot_and_symlink_escapes_are_refused(layout):
    roots = allowed_roots()
    with pytest.raises(PathNotAllowedError, match=r"annotation.exports\[0\]: ../secret/key.json resolves to .*secret"):
        resolve_allowed("../secret/key.json", "annotation.exports[0]", roots)
    os.symlink(layout / "secret" / "key.json", layout / "project" / "data" / "link.json")
    with pytest.raises(PathNotAllowedError, match="outside the allowed roots"):
        resolve_allowed("data/link.json", "k", roots)


def test_env_roots_allow_and_missing_files_are_named(layout, monkeypatch):
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", os.pathsep.join([str(layout / "secret"), ""]))
    assert resolve_allowed(layout / "secret" / "key.json", "k", allowed_roots()).name == "key.json"
    with pytest.raises(PathNotAllowedError, match="k: data/nope.json does not exist"):
        resolve_allowed("data/nope.json", "k", allowed_roots())


def test_a_url_given_as_a_path_is_refused_without_showing_it(layout):
    with pytest.raises(PathNotAllowedError, match=r"policy_model.pretrained: a URL \(not shown\), not a local path") \
            as err:
        resolve_allowed("https://hub.example/org/model?token=hf_Tok0A1B", "policy_model.pretrained", allowed_roots())
    assert "0A1B" not in str(err.value)


def test_every_path_field_of_a_round_config_is_checked(layout):
    cfg = parse_config({
        "workdir": str(layout / "project" / "runs"),
        "annotation": {"exports": ["data/ok.json"]},
        "generation": {"generators": [{"name": "other", "model": "../secret", "strategies": [{"name": "g"}]}]},
    })
    with pytest.raises(PathNotAllowedError, match=r"generation.generators\[0\].model"):
        check_config_paths(cfg)
    cfg = parse_config({"policy_model": {"pretrained": "/etc"}})
    with pytest.raises(PathNotAllowedError, match="policy_model.pretrained"):
        check_config_paths(cfg)
    local_judge = {"judge": "local", "local": {"model_path": "."}}
    for key, section in (
            ("evaluation.local.model_path", {"evaluation": {"judge": "local", "local": {"model_path": "/etc"}}}),
            ("evaluation.prompt_source", {"evaluation": local_judge | {"prompt_set": "harmbench",
                                                                       "prompt_source": "/etc"}}),
            ("reward.deepspeed", {"reward": {"deepspeed": "/etc/ds.json"}})):
        with pytest.raises(PathNotAllowedError, match=key):
            check_config_paths(parse_config(section))
    assert check_config_paths(parse_config({"annotation": {"exports": ["data/ok.json"]}})) == {
        "annotation.exports[0]": layout / "project" / "data" / "ok.json"}


def test_a_directory_export_a_file_workdir_a_non_utf8_config_and_a_one_response_plan_are_refused(layout):
    from rlhf_core.config import ConfigError, load_config

    with pytest.raises(PathNotAllowedError, match=r"annotation.exports\[0\]: .*data is a directory"):
        check_config_paths(parse_config({"annotation": {"exports": ["data"]}}))
    with pytest.raises(PathNotAllowedError, match="workdir: .*ok.json is a file"):
        check_config_paths(parse_config({"workdir": "data/ok.json"}))
    utf16 = layout / "project" / "round.yaml"
    utf16.write_text("seed: 3\n", encoding="utf-16")
    with pytest.raises(ConfigError, match="round.yaml is not UTF-8 text"):
        load_config(utf16)
    one = {"generation": {"generators": [{"name": "policy", "model": "policy",
                                          "strategies": [{"name": "greedy", "temperature": 0.0, "n": 1}]}]}}
    with pytest.raises(ConfigError, match="the plan gives at most 1 distinct response per prompt"):
        parse_config(one)
    assert parse_config(one | {"annotation": {"exports": ["data/ok.json"]}})  # pairs come from the exports


def test_a_deepspeed_json_with_its_own_optimizer_or_not_json_is_refused_before_any_work(layout):
    data = layout / "project" / "data"
    (data / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    assert check_config_paths(parse_config({"ppo": {"deepspeed": "data/ds.json"}})) == {
        "ppo.deepspeed": data / "ds.json"}
    (data / "adam.json").write_text('{"zero_optimization": {"stage": 3}, "optimizer": {"type": "Adam"}, '
                                    '"scheduler": {"type": "WarmupLR"}}')
    with pytest.raises(PathNotAllowedError, match=r"reward.deepspeed: .*adam.json names optimizer and scheduler; "
                                                  "the stage brings its own AdamW"):
        check_config_paths(parse_config({"reward": {"deepspeed": "data/adam.json"}}))
    (data / "torn.json").write_text('{"zero_optimization": {"sta')
    with pytest.raises(PathNotAllowedError, match=r"ppo.deepspeed: .*torn.json is not a readable DeepSpeed JSON"):
        check_config_paths(parse_config({"ppo": {"deepspeed": "data/torn.json"}}))
    with pytest.raises(PathNotAllowedError, match=r"ppo.deepspeed: .*ok.json holds a JSON list"):
        check_config_paths(parse_config({"ppo": {"deepspeed": "data/ok.json"}}))


def test_a_model_path_that_holds_no_model_is_refused_with_the_config(layout):
    """A generator, the pretrained policy or the local judge pointed at a directory without a model failed only in
    its stage, after SFT had run."""
    for key, section in (
            ("generation.generators[1].model", {"generation": {"generators": [
                {"name": "policy", "strategies": [{"name": "a"}, {"name": "b"}]},
                {"name": "other", "model": "data", "strategies": [{"name": "g"}]}]}}),
            ("policy_model.pretrained", {"policy_model": {"pretrained": "data"}}),
            ("evaluation.local.model_path", {"evaluation": {"judge": "local", "local": {"model_path": "data"}}})):
        with pytest.raises(PathNotAllowedError, match=re.escape(key) + ": .*data is not a Hugging Face model"):
            check_config_paths(parse_config(section))


def test_a_model_path_that_holds_no_causal_lm_is_refused_with_the_config(layout):
    """A sentence encoder (MiniLM, the tagger's backbone) given as the pretrained policy passed `rlhf validate` and
    failed SFT with "Could not infer dtype of NoneType"."""
    from transformers import BertConfig

    from rlhf_core import models

    encoder = layout / "project" / "data" / "encoder"
    BertConfig(vocab_size=300, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
               architectures=["BertModel"]).save_pretrained(encoder)  # as all-MiniLM-L6-v2's config.json says
    models.build_tokenizer().save_pretrained(encoder)
    for section in ({"policy_model": {"pretrained": "data/encoder"}},
                    {"evaluation": {"judge": "local", "local": {"model_path": "data/encoder"}}}):
        with pytest.raises(ValueError, match=r"is a 'bert' model \(BertModel\), not a causal LM"):
            check_config_paths(parse_config(section))
    # a causal LM whose class AutoModelForCausalLM maps under another suffix (Gemma 3 4B-27B) is one
    from transformers import Gemma3Config

    gemma = layout / "project" / "data" / "gemma"
    Gemma3Config(architectures=["Gemma3ForConditionalGeneration"]).save_pretrained(gemma)
    models.build_tokenizer().save_pretrained(gemma)
    check_config_paths(parse_config({"policy_model": {"pretrained": "data/gemma"}}))
    (layout / "project" / "data" / "tags").mkdir()  # a vocabulary "file" that is a directory: one line, no traceback
    with pytest.raises(PathNotAllowedError, match="vocabulary_file: .* is a directory; give the file of tags"):
        check_config_paths(parse_config({"sampling": {"tagger": {"source": "embedding",
                                                                 "vocabulary_file": "data/tags"}}}))
