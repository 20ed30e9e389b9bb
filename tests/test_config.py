"""Configs fail at the boundary, naming the key and the expected type."""

import json

import pytest

from rlhf_core.config import ConfigError, PPOConfig, RoundConfig, config_digest, load_config, parse_config


def test_defaults_validate_and_digest_is_stable():
    assert config_digest(RoundConfig()) == config_digest(RoundConfig())
    assert config_digest(RoundConfig(seed=1)) != config_digest(RoundConfig())


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("ppo:\n  kl_coeff: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "ppo.kl_coeff: unknown key (did you mean ppo.kl_coef?" in str(err.value)


@pytest.mark.parametrize("key, suggestion", [
    ("ppo.polcy_lr", "did you mean ppo.policy_lr?"),  # a misspelling: the closest key of its section
    ("policy_lr", "did you mean ppo.policy_lr?"),  # a key of a section given at the top
    ("ppo.n_models", "did you mean voting.n_models?"),  # ... or in another section
    ("base_url", "did you mean sampling.tagger.base_url or evaluation.http.base_url?"),
    ("evaluation.http.base_ur", "did you mean evaluation.http.base_url?"),  # in a nested section
    ("zzz", "unknown key (check the spelling"),  # nothing close: no guess
    ("temperature", "unknown key (check the spelling"),  # a field of list items is no section to suggest
])
def test_an_unknown_key_says_which_key_was_meant(key, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides=[f"{key}=1"])
    assert f"  {key}: unknown key (" in str(err.value) and suggestion in str(err.value)


def test_wrong_type_names_key_and_expected_type(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("ppo:\n  iterations: many\nvoting:\n  n_models: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "ppo.iterations: Input should be a valid integer" in msg and "'many'" in msg
    assert "voting.n_models: Input should be greater than or equal to 2" in msg


def test_overrides_and_cross_field_check(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("seed: 3\n")
    cfg = load_config(path, overrides=["ppo.kl_coef=0.2", "sampling.n_samples=20"])
    assert cfg.seed == 3 and cfg.ppo.kl_coef == 0.2 and cfg.sampling.n_samples == 20
    # no file: the defaults (`rlhf demo`'s) with the same overrides
    defaults = load_config(None, overrides=["seed=3", "ppo.kl_coef=0.2"])
    assert defaults == parse_config({"seed": 3, "ppo": {"kl_coef": 0.2}})
    with pytest.raises(ConfigError, match=r"\(defaults \+ --set\)"):
        load_config(None, overrides=["ppo.kl_coef=high"])
    with pytest.raises(ConfigError, match="exceeds world.n_prompts"):
        parse_config({"world": {"n_prompts": 10}, "sampling": {"n_samples": 11}})
    # a section's own cross-key check is shown as its message alone, a wrong section type with its key
    with pytest.raises(ConfigError) as err:
        parse_config({"ppo": {"reward_norm": True, "reward_scaling": True}, "seed": {"a": 1}})
    assert set(str(err.value).splitlines()[1:]) == {
        "  ppo.reward_norm and ppo.reward_scaling are alternatives: set one of them false",
        "  seed: Input should be a valid integer (got a mapping)"}


def test_configs_are_frozen():
    from pydantic import ValidationError

    cfg = PPOConfig()
    with pytest.raises(ValidationError, match="frozen"):
        cfg.kl_coef = 1.0  # type: ignore[misc]


def test_shipped_configs_are_valid():
    from pathlib import Path

    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        load_config(path)


def test_demo_yaml_is_the_embedded_default():
    from pathlib import Path

    assert load_config(Path(__file__).parents[1] / "configs" / "demo.yaml") == RoundConfig()


def test_a_partial_section_keeps_the_rounds_other_values():
    # the round's PPO defaults differ from PPOConfig's; overriding one key must not reset the others
    cfg = parse_config({"ppo": {"iterations": 7}})
    assert cfg.ppo.iterations == 7 and cfg.ppo.policy_lr == RoundConfig().ppo.policy_lr != PPOConfig().policy_lr
    assert parse_config({"voting": {"train": {"lr": 0.01}}}).voting.train.epochs == RoundConfig().voting.train.epochs


def test_a_partial_section_keeps_the_rounds_values_through_a_prefect_parameter_too():
    """`prefect deployment run rlhf-round/demo --param config='{"ppo": {"iterations": 10}}'` validates the
    mapping with pydantic, not parse_config: it must keep the round's PPO learning rate and voters' epochs."""
    from flows.round import rlhf_round

    for cfg in (rlhf_round.validate_parameters({"config": {"seed": 1, "ppo": {"iterations": 10}}})["config"],
                RoundConfig.model_validate({"ppo": {"iterations": 10}, "voting": {"train": {"lr": 0.01}}})):
        assert cfg.ppo.iterations == 10 and cfg.ppo.policy_lr == RoundConfig().ppo.policy_lr != PPOConfig().policy_lr
        assert cfg.voting.train.epochs == RoundConfig().voting.train.epochs == 1
    assert RoundConfig.model_validate({"ppo": {"preset": "vanilla"}}).ppo.kl_coef == 0  # the preset still fills


def test_schema_descriptions_hold_no_angle_bracket_placeholders():
    """The Prefect UI renders descriptions as Markdown/HTML: "<workdir>" would vanish as an unknown tag."""
    import json
    import re

    assert not re.findall(r"<[A-Za-z_][^<>]{0,30}>", json.dumps(RoundConfig.model_json_schema()))


def test_every_flow_parameter_has_a_description_in_the_ui_form():
    from prefect.utilities.callables import parameter_schema

    from flows.round import rlhf_round, rlhf_rounds

    for flow in (rlhf_round, rlhf_rounds):
        properties = parameter_schema(flow.fn).properties
        assert properties and all(p.get("description") for p in properties.values()), flow.name


@pytest.mark.parametrize("config, secret", [
    ({"tracking_uri": "postgresql://mlflow:hunter2-db@db:5432/mlflow"}, "hunter2-db"),
    ({"evaluation": {"http": {"base_url": "https://user:sk-in-url-0a1b@api.example/v1"}}}, "sk-in-url-0a1b"),
    ({"evaluation": {"http": {"base_url": "https://api.example/v1?key=AIza-in-query"}}}, "AIza-in-query"),
    ({"sampling": {"tagger": {"base_url": "https://api.example/v1?access_token=tok-in-query"}}}, "tok-in-query"),
    ({"evaluation": {"http": {"api_key_env": "gsk_pastedKey0a1b2c"}}}, "gsk_pastedKey0a1b2c"),  # a Groq-shaped key
    # a token as the user of an http(s) URL (httpx sends it as Basic auth), a path or ;-parameter, a fragment
    ({"tracking_uri": "https://tok-as-user-0a1b@mlflow.example"}, "tok-as-user-0a1b"),
    ({"evaluation": {"http": {"base_url": "https://api.example/v1;key=semi-0a1b"}}}, "semi-0a1b"),
    ({"evaluation": {"http": {"base_url": "https://api.example/v1?x=1;token=semi-q-0a1b"}}}, "semi-q-0a1b"),
    ({"evaluation": {"http": {"base_url": "https://fn.example/api?code=azure-fn-0a1b"}}}, "azure-fn-0a1b"),
    ({"evaluation": {"http": {"base_url": "https://api.example/v1#access_token=frag-0a1b"}}}, "frag-0a1b"),
    # a key pasted where a Secret block's name goes: lower case (sk-...) or mixed case
    ({"evaluation": {"http": {"secret_block": "sk-proj-lower0a1b"}}}, "sk-proj-lower0a1b"),
    ({"evaluation": {"http": {"secret_block": "sk-Proj-Mixed0A1B"}}}, "sk-Proj-Mixed0A1B"),
])
def test_a_credential_in_a_url_or_a_key_in_api_key_env_is_refused_without_showing_it(config, secret):
    """Config values reach MLflow params, manifests and error messages: a secret must stop at the boundary."""
    with pytest.raises(ConfigError, match="not shown") as err:
        parse_config(config)
    assert secret not in str(err.value)


def test_urls_and_variable_names_without_credentials_pass():
    cfg = parse_config({"tracking_uri": "http://127.0.0.1:5000",
                        "evaluation": {"http": {"base_url": "http://127.0.0.1:8000/v1?api-version=2024-06-01",
                                                "api_key_env": "AZURE_OPENAI_API_KEY"}}})
    assert cfg.tracking_uri == "http://127.0.0.1:5000" and cfg.evaluation.http.api_key_env == "AZURE_OPENAI_API_KEY"
    # a database user without its password (PGPASSWORD gives that) and a block's name pass
    assert parse_config({"tracking_uri": "postgresql://mlflow@db:5432/mlflow",
                         "evaluation": {"http": {"secret_block": "judge-key-2"}}}).evaluation.http.secret_block


def test_the_deployments_schema_refuses_urls_with_credentials_before_prefect_stores_a_run():
    """Prefect's server checks a run's parameters against the deployment's JSON schema before it stores them; the
    flow's own validators run only later, in the worker. The schema's patterns refuse what they refuse."""
    import jsonschema

    from rlhf_core.config import RoundConfig

    schema = RoundConfig.model_json_schema()
    judge = schema["$defs"]["HTTPJudgeConfig"]["properties"]
    for prop in (schema["properties"]["tracking_uri"], judge["base_url"]):
        for url in ("postgresql://u:pw@db/x", "https://tok@api.example/v1", "https://api.example/v1#tok"):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(url, prop)
        for url in ("https://api.openai.com/v1", "http://127.0.0.1:8000/v1", "sqlite:////srv/mlflow.db",
                    "postgresql://mlflow@db/mlflow", None):
            jsonschema.validate(url, prop)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("sk-Proj-Mixed0A1B", judge["secret_block"])


def test_the_deployments_schema_refuses_a_key_in_any_string_field_before_prefect_stores_a_run():
    """Only the URL fields, api_key_env and secret_block had patterns: a key pasted into the judge's model name, the
    round's name or an export path was stored in Prefect's database with the run's parameters (the flow refused it
    only later). Prefect's own validator over the flow's parameter schema, as the server runs it."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    from flows.round import rlhf_round

    schema = parameter_schema(rlhf_round.fn).model_dump_for_openapi()
    key = "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456"
    for config in ({"evaluation": {"http": {"model": key}}}, {"name": f"week-{key}"},
                   {"annotation": {"exports": ["a.json", f"{key}.json"]}}, {"sampling": {"tagger": {"model": key}}}):
        assert validate({"config": config}, schema), config
    for config in ({"name": "week-12"}, {"annotation": {"exports": ["exports/hf_ultrafeedback_binarized.jsonl"]}},
                   {"evaluation": {"http": {"model": "gpt-4o-2024-08-06"}}}):
        assert validate({"config": config}, schema) == [], config


def test_a_url_from_the_environment_is_shown_without_its_user_and_password():
    from rlhf_core.config import url_without_userinfo

    assert url_without_userinfo("http://ops:pw-0a1b@prefect.example:4200/runs/1") == "http://prefect.example:4200/runs/1"
    assert url_without_userinfo("https://tok@h/x?y=1") == "https://h/x?y=1"
    assert url_without_userinfo("http://127.0.0.1:4200/runs") == "http://127.0.0.1:4200/runs"


def test_mlflow_tracking_uri_from_the_environment_with_a_password_is_refused_unshown(monkeypatch, tmp_path):
    """The round shows its tracking URI in run links, summaries and messages: the environment's must hold no
    password either (MLflow reads MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, a database PGPASSWORD)."""
    from tasks.tracking import default_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://rlhf:hunter2-env@db:5432/mlflow")
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_URI: the URL holds a password") as err:
        default_tracking_uri(tmp_path)
    assert "hunter2-env" not in str(err.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert default_tracking_uri(tmp_path) == "http://127.0.0.1:5000"


def test_prefect_logs_a_refused_parameter_without_its_value(caplog):
    """Prefect's own parameter validation logged pydantic's errors with each refused value, and every parameter, on
    the worker's console; the flows package hides them there (the state message names the keys without values)."""
    import logging

    from prefect.exceptions import ParameterTypeError

    from flows.round import rlhf_round

    secrets = ("sk-proj-pasted0A1B2C", "hunter2-form")
    config = {"evaluation": {"http": {"api_key_env": secrets[0]}}, "tracking_uri": f"postgresql://u:{secrets[1]}@db/m"}
    with caplog.at_level(logging.ERROR, logger="prefect.flows"), pytest.raises(ParameterTypeError) as err:
        rlhf_round.validate_parameters({"config": config})
    logged = [r.getMessage() for r in caplog.records if r.name == "prefect.flows"]
    assert logged and all(s not in line for s in secrets for line in logged)
    assert "config.evaluation.http.api_key_env" in str(err.value) and all(s not in str(err.value) for s in secrets)


def test_mlflow_params_drop_credential_keys_and_keep_token_counts():
    from tasks.tracking import flatten_params

    params = flatten_params({"generation": {"max_new_tokens": 24}, "evaluation": {"http": {
        "max_tokens": 1024, "api_key_env": "OPENAI_API_KEY", "secret_block": "openai"}}, "hf_token": "hf_x"})
    assert params == {"generation.max_new_tokens": "24", "evaluation.http.max_tokens": "1024"}


def test_mlflow_params_write_sequences_as_json_and_cut_only_past_mlflows_limit_visibly():
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    from tasks.tracking import flatten_params

    shas = [f"{i:064x}" for i in range(8)]  # 8 exports' digests: 544 characters, all kept
    params = flatten_params({"world": {"operations": ("+", "-")}, "ops": ["+", "-"], "export_sha256": shas,
                             "huge": "x" * 7000})
    assert params["world.operations"] == params["ops"] == '["+", "-"]'
    assert json.loads(params["export_sha256"]) == shas
    assert len(params["huge"]) == MAX_PARAM_VAL_LENGTH and params["huge"].endswith("... [cut: 7000 characters]")


def test_judged_prompts_are_bounded_by_the_worlds_held_out_prompts_only_when_they_are_the_worlds():
    """docs/judge.md judges all 939 Do-Not-Answer prompts; the world's 200 held-out prompts do not bound that."""
    http = {"judge": "http", "http": {"base_url": "http://127.0.0.1:8000/v1"}}
    assert parse_config({"evaluation": http | {"prompt_set": "do_not_answer", "n_prompts": 939}}).evaluation.n_prompts \
        == 939
    with pytest.raises(ConfigError, match=r"evaluation.n_prompts \(939\) exceeds world.n_eval_prompts \(200\)"):
        parse_config({"evaluation": {"n_prompts": 939}})


@pytest.mark.parametrize("overrides, message", [
    (["seed=-1"], "seed: Input should be greater than or equal to 0"),  # it failed in the sample stage, after SFT
    (["ppo.policy_lr=.inf"], "ppo.policy_lr: Input should be a finite number"),  # it passed gt=0, broke PPO's metrics
    (["policy_model.hidden_size=30"], "hidden_size (30) must be a multiple of num_attention_heads (4)"),
    (["policy_model.num_hidden_layers=0"], "policy_model.num_hidden_layers: Input should be greater than or equal"),
    (["voting.scheme=out_of_fold", "voting.n_models=2", "voting.folds=3"], "needs n_models (2) >= folds (3)"),
    (["voting.scheme=out_of_fold", "voting.mode=fast"], "use mode faithful"),
    (["ppo.iterations=["], "override of 'ppo.iterations': the value is not valid YAML"),
    (["ppo.max_new_tokens=500"], "ppo.max_new_tokens (500) leaves no room for a prompt in the policy's context "
                                 "(policy_model.max_position_embeddings 128)"),  # PPO ran past it without a word
    # 2026-11-29, each accepted before: YAML booleans as numbers (ran with 1.0, 1 and 0) ...
    (["ppo.kl_coef=yes"], "ppo.kl_coef: Value error, true is not a number"),
    (["sft.steps=on"], "sft.steps: Value error, true is not a number"),
    (["seed=false"], "seed: Value error, false is not a number"),
    # ... a learning-rate warm-up the run never finishes (the peak rate never reached) ...
    (["ppo.policy_lr_warmup_steps=1000"], "ppo.policy_lr_warmup_steps (1000) is not shorter than the run's"),
    (["ppo.critic_lr_warmup_steps=5000"], "ppo.critic_lr_warmup_steps (5000) is not shorter than the run's"),
    # ... and settings that failed at their stage, after SFT
    (["world.annotators_per_pair=7"], "world.annotators_per_pair (7) exceeds world.n_annotators (6)"),
    (["generation.generators=[{name: policy, strategies: [{name: greedy, temperature: 0, n: 4}]}]"],
     "the plan gives at most 1 distinct response per prompt"),
    (["reward.train.meta.enabled=true", "reward.train.meta.samples_per_prompt=6"],
     "reward.train.meta.samples_per_prompt (6) exceeds the 4 distinct responses per prompt"),
    # ... MetaRM's samples are the policy's own: another model's responses do not count
    (["reward.train.meta.enabled=true", "reward.train.meta.samples_per_prompt=3",
      "generation.generators=[{name: policy, strategies: [{name: t1, n: 2}]}, "
      "{name: big, model: other-model, strategies: [{name: t1, n: 2}]}]"],
     "(3) exceeds the 2 distinct responses per prompt the generation plan gives the policy"),
    (["generation.backend=vllm", "generation.num_processes=2"], "generation.backend 'vllm' runs in one process"),
    (["evaluation.cache_file=/tmp/j.sqlite"], "must be a path relative to the workdir"),  # written outside the roots
    # CleanRL's value-loss weight: the critic's own AdamW ignores it (a review measured 0.5 and 5.0: the same run)
    (["ppo.vf_coef=1.0"], "would change nothing: the critic has its own AdamW"),
    (["sampling.tagger.cache_file=../tags.jsonl"], "must be a path relative to the workdir"),
])
def test_settings_that_failed_only_stages_later_are_refused_when_the_config_is_read(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides=overrides)
    assert message in str(err.value)


def test_a_key_pasted_into_any_config_value_is_refused_unshown():
    """Only api_key_env and secret_block were checked: a key in the model name or a path was logged as a param."""
    for item in ("evaluation.http.model=sk-proj-Pasted0A1B2C3D4E5F6G",
                 "sampling.tagger.cache_file=hf_Pasted0A1B2C3D4E5F6",
                 "sampling.tagger.vocabulary=[math, sk-proj-Pasted0A1B2C3D4E5F6G]",  # a list's items too
                 "annotation.exports=[sk-proj-Pasted0A1B2C3D4E5F6G]"):
        with pytest.raises(ConfigError, match="looks like an API key") as err:
            load_config(None, overrides=[item])
        assert "0A1B2C3D" not in str(err.value)
    assert load_config(None, overrides=["name=ask-for-a-sketch"]).name == "ask-for-a-sketch"  # words are no keys
    # nor are file names: a dataset export named like a key's prefix was refused as "an API key, not shown"
    named = load_config(None, overrides=["annotation.exports=[exports/hf_ultrafeedback_binarized.jsonl, "
                                         "sk-learn_style_rankings_v2.csv]",
                                         "sampling.tagger.cache_file=hf_ultrafeedback_tag_cache.jsonl"])
    assert named.annotation.exports == ("exports/hf_ultrafeedback_binarized.jsonl", "sk-learn_style_rankings_v2.csv")
    named = load_config(None, overrides=["policy_model.pretrained=models/hf_SmolLM2-135M-Instruct"])  # words
    assert named.policy_model.pretrained == "models/hf_SmolLM2-135M-Instruct"
    # but a key in a URL's path, or pasted with a full stop after it, is still one: its body is random (a DeepSeek
    # key's lower-case hex too)
    for item in ("evaluation.http.base_url=https://gateway.example.com/sk-proj-AbCdEfGhIjKlMnOpQrStUv123456/v1",
                 "evaluation.http.model=sk-proj-AbCdEfGhIjKlMnOpQrStUv123456.",
                 "evaluation.http.model=sk-0123456789abcdef0123456789abcdef"):
        with pytest.raises(ConfigError, match="looks like an API key") as err:
            load_config(None, overrides=[item])
        assert "AbCdEf" not in str(err.value) and "89abcdef" not in str(err.value)


def test_a_malformed_override_names_its_key_never_its_value():
    """`--set` items are typed on command lines: a key put in the wrong place must not come back in the error."""
    for item, shown in (("sk-proj-NoEquals0A1B", "(not shown"), ("evaluation.http.api_key_env", "'evaluation.http"),
                        ("evaluation.x=[sk-proj-Bad0A1B", "'evaluation.x'"), ("seed.x=sk-proj-Sec0A1B", "'seed.x'")):
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides=["seed=0", item])
        assert shown in str(err.value) and "0A1B" not in str(err.value), str(err.value)


def test_a_key_given_twice_in_a_file_is_refused_not_silently_replaced(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("ppo: {iterations: 10}\nseed: 1\nppo: {policy_lr: 1.0e-5}\n")  # the second ppo replaced the first
    with pytest.raises(ConfigError, match="key 'ppo' is given twice: merge the two"):
        load_config(path)
    (tmp_path / "nested.yaml").write_text("ppo:\n  iterations: 10\n  iterations: 20\n")
    with pytest.raises(ConfigError, match="key 'iterations' is given twice"):
        load_config(tmp_path / "nested.yaml")
    # a YAML merge key is no key given twice (it was refused as "could not determine a constructor")
    (tmp_path / "merge.yaml").write_text("voting:\n  train: &train {epochs: 2, lr: 1.0e-4}\n"
                                         "reward:\n  train: {<<: *train, epochs: 3}\n")
    merged = load_config(tmp_path / "merge.yaml")
    assert (merged.reward.train.epochs, merged.reward.train.lr, merged.voting.train.epochs) == (3, 1e-4, 2)
