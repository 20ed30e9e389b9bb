"""The generation plan over several models: config checks, model checks, ids, repetition penalty, resume, vLLM."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlhf_core import models
from rlhf_core.artifacts import ArtifactStore
from rlhf_core.config import (
    ConfigError,
    GenerationConfig,
    GeneratorSpec,
    PolicyModelConfig,
    SamplingStrategy,
    parse_config,
)
from rlhf_core.generation import shards
from rlhf_core.generation.generators import check_prompts_fit, resolve_generators
from rlhf_core.generation.plan import GenerationInputError
from rlhf_core.generation.sampler import RepetitionPenalty, sample_batch
from rlhf_core.generation.shards import gather_plan, generate_plan_shards
from rlhf_core.schemas import validate_table, write_table

TINY = PolicyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
PLAN = (SamplingStrategy(name="hot", temperature=1.0, n=2, max_new_tokens=5),
        SamplingStrategy(name="greedy", temperature=0.0, n=1, max_new_tokens=5))
PROMPTS = pd.DataFrame({"prompt_id": [f"p{i:02d}" for i in range(10)],
                        "prompt": [f"What is {i}+{i % 3}?" for i in range(10)]})
POLICY_DIGEST = "ab" * 32  # stands for the policy artifact's digest in library-level tests


def _save_tiny(path: Path, seed: int = 0, **overrides) -> Path:
    tok = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY.model_copy(update=overrides), tok, seed=seed), tok, path)
    return path


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("models") / "policy")


def _specs(path_model: Path) -> tuple[GeneratorSpec, ...]:
    """The round's policy, plus the same tiny policy given as a path model."""
    return (GeneratorSpec(name="policy", strategies=PLAN), GeneratorSpec(name="copy", model=str(path_model),
                                                                        strategies=PLAN))


# ---------------------------------------------------------------- config


def test_default_plan_is_the_policy_with_the_two_strategies():
    (policy,) = GenerationConfig().generators
    assert policy.name == "policy" and policy.model == "policy" and GenerationConfig().backend == "auto"
    assert [(s.name, s.temperature, s.top_p, s.n, s.repetition_penalty) for s in policy.strategies] == \
           [("t1.0", 1.0, 1.0, 2, 1.0), ("t0.7-p0.9", 0.7, 0.9, 2, 1.0)]


@pytest.mark.parametrize("generation, message", [
    ({"generators": [{"name": "a", "strategies": [{"name": "s"}, {"name": "s"}]}]},
     "generator 'a': strategy names must be unique, repeated: ['s']"),
    ({"generators": [{"name": "a", "strategies": [{"name": "s"}]}, {"name": "a", "strategies": [{"name": "t"}]}]},
     "generation.generators: names must be unique, repeated: ['a']"),
    ({"generators": [{"name": "a", "strategies": [{"temperature": -1}]}]},
     "generation.generators.0.strategies.0.temperature: Input should be greater than or equal to 0"),
    ({"generators": [{"name": "a", "strategies": [{"top_p": 1.5}]}]},
     "generation.generators.0.strategies.0.top_p: Input should be less than or equal to 1"),
    ({"generators": [{"name": "a", "strategies": [{"top_k": -2}]}]}, "strategies.0.top_k: Input should be greater"),
    ({"generators": [{"name": "a", "strategies": [{"max_new_tokens": 0}]}]}, "strategies.0.max_new_tokens: Input"),
    ({"generators": [{"name": "a", "strategies": [{"repetition_penalty": 0}]}]}, "repetition_penalty: Input should"),
    ({"generators": [{"name": "a/b", "strategies": [{}]}]}, "generation.generators.0.name: String should match"),
    ({"generators": [{"name": "a", "strategies": []}]}, "generator 'a' has no strategies; give at least one"),
    ({"generators": []}, "generation.generators is empty; give at least one generator"),
    ({"backend": "tgi"}, "generation.backend: Input should be 'auto', 'hf' or 'vllm'"),
])
def test_bad_plans_are_rejected_naming_the_field(generation, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"generation": generation})
    assert message in str(err.value)


# ---------------------------------------------------------------- models: ids and checks


def test_two_generators_write_rows_of_both_with_distinct_names_and_ids(policy_dir, tmp_path):
    path_model = Path(shutil.copytree(policy_dir, tmp_path / "elsewhere" / "copy"))
    generators = resolve_generators(_specs(path_model), str(policy_dir), POLICY_DIGEST)
    policy_id, copy_id = (g.generator_id for g in generators)
    assert policy_id == f"policy:{POLICY_DIGEST[:12]}" and copy_id.startswith("copy:") and len(copy_id) == 17
    # the id is a content digest: another copy of the same files gets the same one, other weights another
    again = Path(shutil.copytree(policy_dir, tmp_path / "again"))
    assert resolve_generators(_specs(again), str(policy_dir), POLICY_DIGEST)[1].generator_id == copy_id
    other = _save_tiny(tmp_path / "other", seed=1)
    assert resolve_generators(_specs(other), str(policy_dir), POLICY_DIGEST)[1].generator_id != copy_id

    generate_plan_shards(generators, PROMPTS, tmp_path / "shards", seed=3, batch_size=4, shard_size=4)
    responses, report = gather_plan(tmp_path / "shards", generators, len(PROMPTS), shard_size=4)
    validate_table("responses", responses)
    assert set(responses["generator"]) == {policy_id, copy_id} and responses["response_id"].is_unique
    # same weights, so greedy answers coincide: one greedy row per prompt survives across both models
    greedy = responses["strategy"].map(lambda s: json.loads(s)["name"]) == "greedy"
    assert responses[greedy].groupby("prompt_id").size().eq(1).all() and greedy.sum() == len(PROMPTS)
    assert report["n_generated"] == 2 * len(PROMPTS) * 3 and report["n_responses"] == len(responses)
    assert report["duplicates_removed"] == report["n_generated"] - len(responses) >= len(PROMPTS)
    for name, gid in [("policy", policy_id), ("copy", copy_id)]:
        assert report[f"{name}/tokens"] > 0 and report[f"{name}/tokens_per_second"] > 0
        assert report[f"{name}/n_responses"] == (responses["generator"] == gid).sum()
    assert report["tokens"] == report["policy/tokens"] + report["copy/tokens"]


def test_one_process_equals_two_ranks_for_a_plan_of_two_models(policy_dir, tmp_path):
    generators = resolve_generators(_specs(policy_dir), str(policy_dir), POLICY_DIGEST)
    generate_plan_shards(generators, PROMPTS, tmp_path / "one", seed=3, batch_size=4, shard_size=4)
    for rank in (1, 0):  # any order
        generate_plan_shards(generators, PROMPTS, tmp_path / "two", seed=3, batch_size=4, shard_size=4, rank=rank,
                             world_size=2)
    one, _ = gather_plan(tmp_path / "one", generators, len(PROMPTS), 4)
    two, _ = gather_plan(tmp_path / "two", generators, len(PROMPTS), 4)
    pd.testing.assert_frame_equal(one, two)


def test_unknown_or_broken_model_paths_are_named_before_any_work(policy_dir, tmp_path):
    def error_for(model: str) -> str:
        specs = (GeneratorSpec(name="policy", strategies=PLAN), GeneratorSpec(name="x", model=model, strategies=PLAN))
        with pytest.raises(GenerationInputError) as err:
            resolve_generators(specs, str(policy_dir), POLICY_DIGEST)
        assert str(err.value).startswith("generation.generators[1].model: ")
        return str(err.value)

    assert "does/not/exist is not a directory; give a local directory" in error_for(str(tmp_path / "does/not/exist"))
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in error_for(str(tmp_path / "empty"))
    broken = Path(shutil.copytree(policy_dir, tmp_path / "broken"))
    (broken / "model.safetensors").unlink()
    assert "has no weights" in error_for(str(broken))
    (broken / "model.safetensors").write_bytes(b"x")
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    assert "does not load with transformers" in error_for(str(broken))


def test_prompts_too_long_are_checked_per_model(policy_dir, tmp_path):
    short = _save_tiny(tmp_path / "short", max_position_embeddings=20)  # the query "Q: What is 0+0?\nA:" is 18
    specs = (GeneratorSpec(name="policy", strategies=PLAN), GeneratorSpec(name="short", model=str(short),
                                                                          strategies=PLAN))
    generators = resolve_generators(specs, str(policy_dir), POLICY_DIGEST)
    check_prompts_fit(generators[:1], PROMPTS)  # fits the policy's 128 positions
    with pytest.raises(GenerationInputError, match=r"row 0 \(prompt_id p00\): query is 18 tokens \+ max_new_tokens "
                                                   r"5 > generator short's 20 positions"):
        check_prompts_fit(generators, PROMPTS)


# ---------------------------------------------------------------- repetition penalty


def test_repetition_penalty_by_hand():
    scores = torch.tensor([[2.0, -2.0, 1.0, 0.5]])  # (B=1, V=4)
    query_mask = torch.tensor([[0, 1, 1]])  # the first position is left padding (token 3): not penalised
    input_ids = torch.tensor([[3, 0, 1, 0]])  # query [pad=3, 0, 1] then one generated token 0
    out = RepetitionPenalty(2.0, query_mask)(input_ids, scores.clone())
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]  # 2/2, -2*2, unseen, padding only
    assert torch.equal(RepetitionPenalty(1.0, query_mask)(input_ids, scores.clone()), scores)


def test_repetition_penalty_changes_greedy_output_where_it_must():
    tok = models.build_tokenizer()
    model = models.build_policy(TINY, tok, seed=0).eval()
    query = models.format_query(tok, "What is 1+1?")
    query_ids = tok(query, add_special_tokens=False, return_tensors="pt").input_ids  # (1, Tq)
    with torch.no_grad():
        logits = model(query_ids).logits[0, -1]  # (V,) scores of the first response token
    penalised = RepetitionPenalty(10.0, torch.ones_like(query_ids))(query_ids, logits[None].clone())[0]
    # the case: greedy's first token is a query token, and penalised another token wins
    assert logits.argmax().item() in query_ids[0].tolist() and penalised.argmax() != logits.argmax()

    plain = sample_batch(model, tok, [query], max_new_tokens=6, temperature=0)
    off = sample_batch(model, tok, [query], max_new_tokens=6, temperature=0, repetition_penalty=1.0)
    on = sample_batch(model, tok, [query], max_new_tokens=6, temperature=0, repetition_penalty=10.0)
    assert torch.equal(plain.response_ids, off.response_ids)  # 1.0 changes nothing
    assert plain.response_ids[0, 0] == logits.argmax() and on.response_ids[0, 0] == penalised.argmax()
    # left padding is not a token of the row: the output is the same alone and in a batch with a longer query
    batched = sample_batch(model, tok, [query, query + " and 12345+678"], max_new_tokens=6, temperature=0,
                           repetition_penalty=10.0)
    assert torch.equal(batched.response_ids[:1], on.response_ids)


# ---------------------------------------------------------------- the stage: no partial artifact, resume


def _stage_inputs(workdir: Path, policy_dir: Path, prompts: pd.DataFrame):
    """A RunContext on a temp MLflow store, and committed sampled_prompts and policy artifacts."""
    from tasks.common import RunContext
    from tasks.tracking import Tracker

    store = ArtifactStore(workdir / "artifacts")
    sampled = prompts.assign(tags=[["t"]] * len(prompts), source="test", n_tags=1,
                             selection_order=range(len(prompts)), selection_reason="fill")
    refs = {}
    for kind, write in [("sampled_prompts", lambda d: write_table("sampled_prompts", sampled,
                                                                  d / "sampled_prompts.parquet")),
                        ("policy", lambda d: shutil.copytree(policy_dir, d, dirs_exist_ok=True))]:
        with store.staging() as staged:
            write(staged)
            refs[kind] = store.commit(staged, kind=kind, stage="test", stage_version="1", code_version="t",
                                      config={}, config_digest="c", inputs={}, cache_key=f"test-{kind}")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    parent = Tracker(uri, "test", workdir / "mlartifacts").start_run("round", {})
    ctx = RunContext(workdir=str(workdir), tracking_uri=uri, experiment="test", parent_run_id=parent,
                     round_name="test")
    return ctx, store, refs["sampled_prompts"], refs["policy"]


@pytest.fixture(scope="module")
def stage(policy_dir, tmp_path_factory):
    return _stage_inputs(tmp_path_factory.mktemp("stage"), policy_dir, PROMPTS)


def _cfg(*specs: GeneratorSpec) -> GenerationConfig:
    return GenerationConfig(generators=specs, batch_size=4, shard_size=4)


def test_stage_with_an_unknown_model_path_writes_no_artifact(stage, tmp_path):
    from tasks.generation import generate

    ctx, store, sampled, policy = stage
    cfg = _cfg(GeneratorSpec(name="policy", strategies=PLAN),
               GeneratorSpec(name="x", model=str(tmp_path / "missing"), strategies=PLAN))
    with pytest.raises(GenerationInputError, match=r"generation.generators\[1\].model: .*missing is not a directory"):
        generate.fn(ctx, cfg, sampled, policy, seed=0)
    short = _save_tiny(tmp_path / "short", max_position_embeddings=20)  # fails inside the stage, after its run starts
    cfg = _cfg(GeneratorSpec(name="policy", strategies=PLAN), GeneratorSpec(name="s", model=str(short),
                                                                           strategies=PLAN))
    with pytest.raises(GenerationInputError, match="generator s's 20 positions"):
        generate.fn(ctx, cfg, sampled, policy, seed=0)
    assert not (store.root / "responses").exists()


def test_killed_stage_resumes_from_its_shards_and_matches_an_uninterrupted_run(stage, policy_dir, tmp_path,
                                                                              monkeypatch):
    from tasks.generation import generate

    ctx, store, sampled, policy = stage
    cfg = _cfg(GeneratorSpec(name="policy", strategies=PLAN), GeneratorSpec(name="copy", model=str(policy_dir),
                                                                           strategies=PLAN))
    write_shard, written = shards._write_shard, []

    def killed_after_three(path, responses, report):
        if len(written) == 3:
            raise KeyboardInterrupt("killed")
        write_shard(path, responses, report)
        written.append(path)

    monkeypatch.setattr(shards, "_write_shard", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        generate.fn(ctx, cfg, sampled, policy, seed=7)
    assert not (store.root / "responses").exists() and len(written) == 3

    def recording(path, responses, report):
        write_shard(path, responses, report)
        written.append(path)

    monkeypatch.setattr(shards, "_write_shard", recording)
    ref = generate.fn(ctx, cfg, sampled, policy, seed=7)
    # 2 generators x 3 shards of 4 prompts: the re-run wrote only the 3 missing ones, never a present one
    assert len(written) == 6 and not set(written[:3]) & set(written[3:])
    resumed = pd.read_parquet(ref.file("responses.parquet"))
    metrics = store.manifest(ref).metrics
    assert metrics["generation/world_size"] == 1 and metrics["generation/n_shards"] == 3
    assert metrics["generation/copy/tokens"] > 0 and metrics["generation/policy/tokens_per_second"] > 0

    fresh_ctx, _, fresh_sampled, fresh_policy = _stage_inputs(tmp_path, policy_dir, PROMPTS)
    fresh = generate.fn(fresh_ctx, cfg, fresh_sampled, fresh_policy, seed=7)
    pd.testing.assert_frame_equal(pd.read_parquet(fresh.file("responses.parquet")), resumed)
    assert not any((Path(ctx.workdir) / "scratch").iterdir())  # committed: the shards are gone


# ---------------------------------------------------------------- vLLM (this machine has no GPU and no vllm)


def test_vllm_backend_is_optional_and_auto_falls_back_to_hf(monkeypatch):
    import torch

    from rlhf_core.generation import vllm_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on CI, and so on a GPU machine too
    vllm_backend.vllm_unavailable_reason.cache_clear()  # (its answer is cached per process)
    try:
        assert vllm_backend.vllm_available() is False
        assert vllm_backend.resolve_backend("auto", num_processes=1) == "hf"
        assert vllm_backend.resolve_backend("hf", num_processes=1) == "hf"
        with pytest.raises(GenerationInputError, match="generation.backend is 'vllm' but vLLM cannot run here: "
                                                       "no CUDA GPU is visible; install vllm on a CUDA machine"):
            vllm_backend.resolve_backend("vllm", num_processes=1)
    finally:
        vllm_backend.vllm_unavailable_reason.cache_clear()  # later tests see the real machine


def test_vllm_rows_match_the_hf_rows_shape_with_a_stand_in_engine(monkeypatch):
    """No GPU here, so vLLM itself never runs in this suite: a stand-in engine with vLLM's API
    (LLM.generate -> outputs[i].outputs[k].text / .token_ids, SamplingParams) checks our glue:
    requests are our token ids, n samples per strategy, greedy once then repeated, ids and dedupe
    as in the transformers backend."""
    import sys
    import types

    from rlhf_core.generation import vllm_backend
    from rlhf_core.generation.plan import response_id, strategy_json

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))
    tok = models.build_tokenizer()
    seen = []

    class Engine:
        def get_tokenizer(self):
            return tok

        def generate(self, requests, params, use_tqdm):
            seen.append((requests, params))
            sample = types.SimpleNamespace
            return [types.SimpleNamespace(outputs=[sample(text=f"a{k % 2}", token_ids=[5, 6]) for k in range(p.n)])
                    for p in params]

    prompts = PROMPTS.head(3)
    rows, report = vllm_backend.generate_with_vllm("unused", prompts, PLAN, "m:1", seed=0, llm=Engine())
    hot, greedy = seen
    assert hot[0][0]["prompt_token_ids"] == tok(models.format_query(tok, prompts["prompt"][0]),
                                                 add_special_tokens=False)["input_ids"]
    assert [p.n for p in hot[1]] == [2, 2, 2] and [p.n for p in greedy[1]] == [1, 1, 1]
    assert {p.max_tokens for p in hot[1]} == {5} and hot[1][0].top_k == -1  # 0 = no top-k in our config
    assert report["n_generated"] == 3 * (2 + 1) and report["tokens"] == 3 * (2 + 1) * 2
    # "a0" from hot k=0 and from greedy k=0 collide per prompt: one is kept, the smallest response_id
    assert len(rows) == 3 * 2 and set(rows["response"]) == {"a0", "a1"}
    row = rows[(rows["prompt_id"] == "p00") & (rows["response"] == "a1")].iloc[0]
    assert row["response_id"] == response_id("p00", "m:1", strategy_json(PLAN[0]), 1, "a1")
    assert row["strategy"] == strategy_json(PLAN[0]) and row["generator"] == "m:1"


def test_each_of_a_strategys_n_samples_draws_its_own_stream():
    """Sample k of a strategy draws with a seed of k too: without it the n samples of a prompt were one sample
    n times (deduplicated to one row)."""
    from rlhf_core.generation.plan import generate_responses

    tok = models.build_tokenizer()
    model = models.build_policy(TINY, tok, seed=0)
    plan = [SamplingStrategy(name="hot", temperature=1.0, n=4, max_new_tokens=8)]
    out, report = generate_responses(model, tok, PROMPTS.head(3), plan, generator="tiny", batch_size=3, seed=0)
    assert report["n_generated"] == 12 and report["duplicates_removed"] == 0
    assert out.groupby("prompt_id")["response"].nunique().tolist() == [4, 4, 4]
    # the longest strategy must fit the model's positions, whichever comes first in the plan
    too_long = [SamplingStrategy(name="short", temperature=0.0, n=1, max_new_tokens=5),
                SamplingStrategy(name="long", temperature=0.0, n=1, max_new_tokens=200)]
    with pytest.raises(GenerationInputError):
        generate_responses(model, tok, PROMPTS.head(1), too_long, generator="tiny", batch_size=1, seed=0)


def test_the_plans_small_rules_on_hand_made_inputs():
    """A query that fills the context exactly fits; identical texts keep the smallest response_id; a context
    length is read under any of its config names."""
    from types import SimpleNamespace

    from rlhf_core.generation.plan import check_prompts, context_length, dedupe

    tok = models.build_tokenizer()
    one = pd.DataFrame({"prompt_id": ["p1"], "prompt": ["What is 12+7?"]})
    n = len(tok(models.format_query(tok, "What is 12+7?"), add_special_tokens=False)["input_ids"])
    check_prompts(one, tok, max_positions=n + 10, max_new_tokens=10)  # exactly full: fits
    with pytest.raises(GenerationInputError):
        check_prompts(one, tok, max_positions=n + 9, max_new_tokens=10)
    rows = pd.DataFrame({"prompt_id": ["p1", "p1"], "response_id": ["rb", "ra"], "prompt": ["q", "q"],
                         "response": ["same", "same"], "generator": ["g2", "g1"], "strategy": ["{}", "{}"]})
    assert dedupe(rows)[["response_id", "generator"]].values.tolist() == [["ra", "g1"]]
    assert [context_length(SimpleNamespace(**{key: 512})) for key in
            ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")] == [512] * 4
    assert context_length(SimpleNamespace()) is None


def test_a_response_id_names_the_sampling_parameters_and_the_text_not_only_the_names():
    """Responses generated again under the same generator and strategy names (a temperature changed, another seed)
    got the ids of the first ones, so a score table's labels, joined by id alone, went to texts nobody saw."""
    import hashlib
    import json
    import types

    from rlhf_core.config import SamplingStrategy
    from rlhf_core.generation.plan import response_row, strategy_json

    prompt = types.SimpleNamespace(prompt_id="p1", prompt="q")
    hot = SamplingStrategy(name="s", temperature=1.0, n=2)
    row = response_row(prompt, "It is 3.", "policy:abc", hot, 0)
    key = json.dumps(["p1", "policy:abc", strategy_json(hot), 0, "It is 3."])
    assert row["response_id"] == "r" + hashlib.sha256(key.encode()).hexdigest()[:16]
    assert row == response_row(prompt, "It is 3.", "policy:abc", hot, 0)  # the same generation, the same id
    others = [response_row(prompt, "It is 3.", "policy:abc", hot.model_copy(update={"temperature": 0.7}), 0),
              response_row(prompt, "It is 4.", "policy:abc", hot, 0), response_row(prompt, "It is 3.", "policy:abd", hot, 0),
              response_row(prompt, "It is 3.", "policy:abc", hot, 1)]
    assert len({row["response_id"], *(o["response_id"] for o in others)}) == 5
