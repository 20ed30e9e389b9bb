"""The simulated world's bootstrap stages: the prompt pool and the SFT policy.

In a real deployment these are inputs (a prompt set, an SFT checkpoint); in the embedded demo
they are built here, tracked and cached like every other stage.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef, content_digest
from rlhf_core.config import PolicyModelConfig, SFTConfig, WorldConfig
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sft import train_sft
from rlhf_core.sim.metrics import policy_answer_probe
from rlhf_core.sim.world import make_demonstrations, make_prompt_pool
from tasks.common import RunContext, StageRun, run_stage

WORLD_VERSION = "4"  # 3: the pool holds no held-out prompt's text; 4: the held-out prompts are distinct texts
SFT_VERSION = "2"
# The world fields each stage reads, and so its cache key: the annotators' settings change the labels,
# not the prompt pool or the SFT policy, so a noisier crowd reuses both.
POOL_FIELDS = {"n_prompts", "n_eval_prompts", "max_operand", "operations", "result_tags"}
SFT_FIELDS = {"max_operand", "operations", "demo_correct_prob", "demo_style_prob"}


@task(name="world", version=WORLD_VERSION, cache_policy=NO_CACHE)
def build_world(ctx: RunContext, cfg: WorldConfig, seed: int) -> ArtifactRef:
    """The simulated prompt pool (to sample from) and the held-out evaluation prompts, held out by text: no held-out
    prompt is in the pool, so neither the SFT policy nor a reward model trains on one; they are distinct texts. (The
    world is small: the same problem with the same styles can still be in the pool under another template.)"""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        kwargs = {"max_operand": cfg.max_operand, "ops": cfg.operations, "result_tags": cfg.result_tags}
        held_out = make_prompt_pool(cfg.n_eval_prompts, seed=seed + 10_000, id_prefix="e", distinct=True, **kwargs)
        pool = make_prompt_pool(cfg.n_prompts, seed=seed, id_prefix="p", **kwargs,
                                held_out=frozenset(held_out["prompt"]))
        write_table("prompts", pool, out / "prompts.parquet")
        write_table("prompts", held_out, out / "eval_prompts.parquet")
        return {"world/n_prompts": len(pool), "world/n_eval_prompts": len(held_out),
                "world/mean_tags": float(pool["tags"].map(len).mean())}

    return run_stage(ctx, stage="world", version=WORLD_VERSION, kind="prompts",
                     config={"world": cfg.model_dump(include=POOL_FIELDS), "seed": seed}, inputs={}, produce=produce)


@task(name="sft", version=SFT_VERSION, cache_policy=NO_CACHE)
def train_sft_policy(ctx: RunContext, world: WorldConfig, model_cfg: PolicyModelConfig, cfg: SFTConfig,
                     prompts: ArtifactRef, seed: int) -> ArtifactRef:
    """The SFT model RLHF starts from: the tiny Qwen2 trained from scratch on the noisy demonstrator, or
    the `pretrained` model fine-tuned on the same demonstrations."""
    pretrained = _pretrained_dir(model_cfg)

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pool = read_table("prompts", prompts.file("prompts.parquet"))
        demos = make_demonstrations(pool, cfg.demos_per_prompt, world.demo_correct_prob, world.demo_style_prob,
                                    seed=seed)
        if pretrained is None:
            tokenizer = models.build_tokenizer()
            policy = models.build_policy(model_cfg, tokenizer, seed=seed)
        else:  # its own tokenizer and chat template (format_query uses it)
            tokenizer, policy = models.load_tokenizer(pretrained), models.load_policy(pretrained)
        metrics = train_sft(policy, tokenizer, demos, cfg, seed=seed, progress=True)
        # how sharply the policy knows the answers: the reward models read correctness from its log-likelihood
        probe = policy_answer_probe(policy, tokenizer, world.max_operand, tuple(world.operations))
        metrics.update({f"sft/probe/{k}": v for k, v in probe.items()})
        models.save_hf(policy, tokenizer, out)
        demos.to_parquet(out / "demonstrations.parquet", index=False)  # PPO's ptx loss reads them
        return {k: float(v) for k, v in metrics.items()}  # already named sft/...

    # The tiny model's cache config is what it always was; a pretrained model is identified by its
    # content, so a re-converted or edited directory is not served from the cache.
    model_config = model_cfg.model_dump(exclude={"pretrained"})
    if pretrained is not None:
        model_config = {"pretrained": model_cfg.pretrained, "pretrained_digest": content_digest(pretrained)[0]}
    config = {"world": world.model_dump(include=SFT_FIELDS), "model": model_config, "sft": cfg.model_dump(),
              "seed": seed}
    return run_stage(ctx, stage="sft", version=SFT_VERSION, kind="policy", config=config,
                     inputs={"prompts": prompts}, produce=produce, register_as="rlhf-sft-policy")


def _pretrained_dir(model_cfg: PolicyModelConfig) -> Path | None:
    """The resolved `policy_model.pretrained` directory, or None; fails early when it holds no model."""
    if model_cfg.pretrained is None:
        return None
    path = Path(model_cfg.pretrained).resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"policy_model.pretrained: {path} is not a Hugging Face model directory (no config.json); "
            + ("point it at one" if path.exists() else  # convert-gguf would refuse (or replace) what is there
               f"make the SmolLM2 one with `rlhf convert-gguf --out {model_cfg.pretrained}`")
        )
    return path
