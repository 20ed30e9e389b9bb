"""The PPO-max training loop: rollout -> advantages -> update, repeated `cfg.iterations` times.

The math lives in `rlhf_core.ppo.core`; this module only moves tensors between the policy, the
frozen reference, the critic and the reward function. Every PPO-max trick is a switch of
`PPOConfig` used in exactly one `if` below (or in core), so vanilla PPO is the same code with
the switches off.

Data parallel over N ranks (`train_ppo(rank=, world_size=)`, launched by rlhf_core.workers.ppo) on
the same code path as one process: each rank samples, scores and runs the forwards of its contiguous
share of every rollout's prompts; the ranks' experiences are gathered, so reward moments, advantages
(whitened over the whole rollout) and metrics are computed on the whole rollout on every rank; each
minibatch step runs on the rank's rows of the global minibatch, its loss weighted by the rank's share of
the minibatch's tokens, and the gradients are summed over the ranks before clipping. Every step is the
1-process step up to float summation order. With a DeepSpeed config (`train_ppo(deepspeed=)`) the policy
and the critic train through DeepSpeed engines (rlhf_core.ppo.learner.DeepSpeedLearner): the same loop.
"""

from __future__ import annotations

import itertools
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModel

from rlhf_core.artifacts import atomic_write
from rlhf_core.config import EXECUTION_SETTINGS, RESOLVED, PPOConfig
from rlhf_core.models import default_device, format_query, load_policy, load_reward_model, load_tokenizer
from rlhf_core.ops import entropy_from_logits, logprobs_from_logits, masked_mean, masked_whiten
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.ppo.data_parallel import Ranks, pad_cat
from rlhf_core.ppo.learner import DeepSpeedLearner, Learner, engine_config
from rlhf_core.ppo.core import (
    AdaptiveKLController,
    RunningMoments,
    explained_variance,
    gae,
    normalize_and_clip,
    policy_loss,
    scale_and_clip,
    token_rewards,
    value_loss,
)
from rlhf_core.progress import progress_bar
from rlhf_core.sft import collate, encode_example

RewardFn = Callable[[list[str], list[str]], torch.Tensor]  # (prompts, responses) -> scores (B,)


class Critic(nn.Module):
    """A transformer backbone with a linear value head: one value per token."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # (B, T, H)
        return self.value_head(hidden).squeeze(-1)  # (B, T)


def build_critic(policy_dir: str | Path, reward_model_dir: str | Path | None) -> Critic:
    """PPO-max initialises the critic from the reward model (backbone and head); else from the policy.

    A reward model already maps a state to "how good", so its head is a far better start for
    V(s) than a random one and the early advantages are less noisy.
    """
    if reward_model_dir is None:
        return Critic(AutoModel.from_pretrained(str(policy_dir), dtype=torch.float32))
    reward_model = load_reward_model(reward_model_dir)  # e.g. Qwen2ForSequenceClassification
    critic = Critic(reward_model.base_model)
    with torch.no_grad():
        critic.value_head.weight.copy_(reward_model.score.weight)  # (1, H)
        critic.value_head.bias.zero_()  # the reward model's head has no bias
    return critic


@dataclass
class Experience:
    """One rollout batch, everything the update needs; (B, Tq) for queries, (B, T) for responses."""

    query_ids: torch.Tensor
    query_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logp: torch.Tensor  # log pi_old(token)
    ref_logp: torch.Tensor  # log pi_ref(token)
    values: torch.Tensor  # V_old(state before the token)
    entropy: torch.Tensor  # policy entropy at each response position
    scores: torch.Tensor  # (B,) raw reward-function scores
    gold: torch.Tensor | None = None  # (B,) the true reward, where the world knows it (never trained on)
    advantages: torch.Tensor | None = None  # filled by compute_advantages
    returns: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    shaped_scores: torch.Tensor | None = None  # (B,) the scores after normalisation / scaling and clipping

    def minibatch(self, idx: torch.Tensor) -> "Experience":
        return Experience(**{k: (v[idx] if v is not None else None) for k, v in vars(self).items()})


def _forward_inputs(batch) -> dict[str, torch.Tensor]:
    """query + response of a Rollout or Experience; position ids count only real tokens, because
    queries are left-padded (generation computes them the same way)."""
    input_ids = torch.cat([batch.query_ids, batch.response_ids], dim=1)  # (B, Tq + T)
    attention_mask = torch.cat([batch.query_mask, batch.response_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def response_logits(model: nn.Module, batch, temperature: float) -> torch.Tensor:
    """Logits that predicted each response token: (B, T, V). Divided by the sampling temperature, so
    log-probs are those of the tempered softmax. With top_p < 1 the tokens were drawn from its nucleus
    only, so log-probs, the KL penalty and the PPO ratio are of the untruncated softmax, as in OpenRLHF
    and TRL: the rollout's KL is then an average over nucleus tokens and can dip below 0 (docs/ppo-max.md)."""
    logits = model(**_forward_inputs(batch)).logits  # (B, Tq + T, V)
    Tq = batch.query_ids.shape[1]
    return logits[:, Tq - 1 : -1] / temperature  # position t predicts token t + 1


def response_values(critic: Critic, batch) -> torch.Tensor:
    """V(s_t) for each response token t, with s_t = query + response[:t]: (B, T)."""
    Tq = batch.query_ids.shape[1]
    return critic(**_forward_inputs(batch))[:, Tq - 1 : -1]


def sample_seeds(seed: int, iteration: int, prompt_index: int, n: int) -> list[int]:
    """The sampling seeds of one prompt's n responses in one rollout: a function of the prompt's index in
    the rollout, not of the rank or the batch that samples it, so N ranks draw what one process draws."""
    return [int(s) for s in np.random.SeedSequence([seed, iteration, prompt_index]).generate_state(n)]


@torch.no_grad()
def rollout(policy, reference, critic, tokenizer, reward_fn: RewardFn, prompts: list[str], cfg: PPOConfig,
            seeds: list[int], gold_fn: RewardFn | None = None) -> Experience:
    """Sample one response per prompt (row i from its own stream seeded with seeds[i]: `sample_batch`'s
    row_seeds), score them (and take their gold score when gold_fn is given), and record log-probs (policy,
    reference) and values."""
    queries = [format_query(tokenizer, p) for p in prompts]
    sample = sample_batch(policy, tokenizer, queries, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                          row_seeds=seeds, return_logits=True)
    device = sample.response_ids.device
    # the policy's logits come from generation (KV cache), not a second forward over the same tokens: they
    # equal `response_logits(policy, sample, ...)` up to float rounding (tests/test_ppo.py)
    logits = sample.logits / cfg.temperature  # (B, T, V)
    ref_logits = response_logits(reference, sample, cfg.temperature)
    return Experience(
        query_ids=sample.query_ids,
        query_mask=sample.query_mask,
        response_ids=sample.response_ids,
        response_mask=sample.response_mask,
        logp=logprobs_from_logits(logits, sample.response_ids),
        ref_logp=logprobs_from_logits(ref_logits, sample.response_ids),
        values=response_values(critic, sample),
        entropy=entropy_from_logits(logits),
        scores=reward_fn(prompts, sample.texts).detach().float().reshape(-1).to(device),  # (B,)
        gold=None if gold_fn is None
        else torch.as_tensor(gold_fn(prompts, sample.texts)).float().reshape(-1).to(device),
    )


QUERY_FIELDS = ("query_ids", "query_mask")  # left-padded; every other (B, T) field is right-padded


def gather_experience(local: Experience, ranks: Ranks, pad_token_id: int) -> Experience:
    """The whole rollout on every rank: the ranks' experiences in rank order (= prompt order), padded to
    common widths (padding is masked out everywhere). One rank: its own experience."""
    device = local.response_ids.device
    parts = ranks.gather({k: v.cpu() for k, v in vars(local).items() if v is not None})
    return Experience(**{k: pad_cat([p[k] for p in parts], pad_token_id if k.endswith("_ids") else 0,
                                     left=k in QUERY_FIELDS).to(device) for k in parts[0]})


def compute_advantages(exp: Experience, moments: RunningMoments, cfg: PPOConfig,
                       kl_coef: float | None = None) -> Experience:
    """Token rewards (score at eos, KL penalty everywhere), GAE, optional whitening and clipping.

    The score is normalised (reward_norm) or scaled (reward_scaling) with the running moments;
    kl_coef (the adaptive controller's value) overrides cfg.kl_coef. Fills `exp`.
    """
    mask, scores = exp.response_mask, exp.scores
    if cfg.reward_norm:
        scores = normalize_and_clip(scores, moments, cfg.reward_clip)
    elif cfg.reward_scaling:
        scores = scale_and_clip(scores, moments, cfg.reward_clip)
    exp.shaped_scores = scores
    coef = cfg.kl_coef if kl_coef is None else kl_coef
    rewards, exp.kl = token_rewards(scores, exp.logp, exp.ref_logp, mask, coef, cfg.kl_estimator)
    exp.advantages, exp.returns = gae(rewards, exp.values, mask, cfg.gamma, cfg.lam)
    if cfg.norm_adv:
        exp.advantages = masked_whiten(exp.advantages, mask) * mask
    if cfg.adv_clip is not None:
        exp.advantages = exp.advantages.clamp(-cfg.adv_clip, cfg.adv_clip) * mask
    return exp


def policy_step(policy: Learner, mb: Experience, share: float, cfg: PPOConfig, ptx_batch=None,
                ranks: Ranks = Ranks()) -> dict[str, float]:
    """One clipped-surrogate step on a minibatch, plus cfg.ptx_coef * the LM loss on a batch of
    pretraining (SFT) examples when one is given (PPO-max's ptx term).

    mb: this rank's rows of the global minibatch (a stand-in row when it has none, see `update`); share:
    their fraction of its response tokens (1 for one rank; 0 for a stand-in). Token means weighted by their share sum over the ranks to the global minibatch's means,
    for the loss and the metrics alike. The ptx batch is split over the ranks the same way."""
    logits = response_logits(policy.model, mb, cfg.temperature)  # (b, T, V)
    logp = logprobs_from_logits(logits, mb.response_ids)  # (b, T)
    pg_loss, metrics = policy_loss(logp, mb.logp, mb.advantages, mb.response_mask, cfg.clip_coef)
    entropy = masked_mean(entropy_from_logits(logits), mb.response_mask) if cfg.ent_coef else torch.zeros(())
    loss = share * (pg_loss - cfg.ent_coef * entropy)
    parts = {"loss/policy": share * pg_loss.item(), "loss/entropy_bonus": share * cfg.ent_coef * entropy.item(),
             "policy/approx_kl": share * metrics["approx_kl"], "policy/clipfrac": share * metrics["clipfrac"],
             "loss/ptx": 0.0}
    if ptx_batch is not None:
        ptx_rows, ptx_share = _ptx_shard(ptx_batch, ranks)
        ptx_loss = policy.model(**{k: v[ptx_rows] for k, v in ptx_batch.items()}).loss
        loss = loss + cfg.ptx_coef * ptx_share * ptx_loss
        parts["loss/ptx"] = ptx_share * ptx_loss.item()
    policy.step(loss, cfg.max_grad_norm, ranks)
    return ranks.sum_metrics(parts)


def _ptx_shard(ptx_batch: dict[str, torch.Tensor], ranks: Ranks) -> tuple[slice, float]:
    """This rank's rows of a ptx batch and their share of its predicted tokens (the LM loss is a mean over
    the labels after the shift). A rank with no rows gets the first row as a stand-in with share 0 (see
    `update`: every rank runs the same forwards)."""
    rows = ranks.shard(len(ptx_batch["labels"]))
    if not len(rows):
        return slice(0, 1), 0.0
    predicted = (ptx_batch["labels"][:, 1:] != -100).sum(1)  # (B,)
    return slice(rows.start, rows.stop), int(predicted[rows.start : rows.stop].sum()) / int(predicted.sum())


def critic_step(critic: Learner, mb: Experience, share: float, cfg: PPOConfig,
                ranks: Ranks = Ranks()) -> dict[str, float]:
    """One (optionally clipped) value-loss step on this rank's rows of a minibatch (see `policy_step`)."""
    values = response_values(critic.model, mb)  # (b, T)
    v_loss, metrics = value_loss(values, mb.values, mb.returns, mb.response_mask, cfg.value_clip, cfg.clip_vloss)
    loss = share * cfg.vf_coef * v_loss
    parts = {"loss/value": share * v_loss.item(), "value/error": share * metrics["error"],
             "value/clipfrac": share * metrics["clipfrac"]}
    critic.step(loss, cfg.max_grad_norm, ranks)
    return ranks.sum_metrics(parts)


def update(policy: Learner, critic: Learner, exp: Experience, cfg: PPOConfig, first_step: int, gen,
           ptx_batches: Iterator[dict] | None = None, ranks: Ranks = Ranks(),
           own_rows: range | None = None) -> dict[str, float]:
    """`cfg.ppo_epochs` passes over shuffled minibatches, one critic step each, and one policy step
    once `cfg.critic_warmup_steps` critic steps are done (PPO-max: the critic learns alone first).
    first_step: the run's optimiser steps before this update. exp: the whole rollout; own_rows: the
    rows this rank steps on (all by default). Returns each metric averaged over the minibatch steps."""
    stats, step = defaultdict(list), first_step
    own_rows = range(exp.response_ids.shape[0]) if own_rows is None else own_rows
    tokens = exp.response_mask.sum(1)  # (B,)
    for _ in range(cfg.ppo_epochs):
        for idx in torch.randperm(exp.response_ids.shape[0], generator=gen).split(cfg.mini_batch_size):
            mine = idx[(idx >= own_rows.start) & (idx < own_rows.stop)]
            share = int(tokens[mine].sum()) / int(tokens[idx].sum())
            if not len(mine):  # a stand-in row weighted 0, so every rank runs the same forwards and backwards
                mine = idx[:1]  # (DeepSpeed's engine reduces gradients in the order the backward makes them)
            mb = exp.minibatch(mine)
            critic_lr = critic.lr  # the rate this step uses (the step moves the schedule on)
            step_metrics = critic_step(critic, mb, share, cfg, ranks) | {"lr/critic": critic_lr}
            if step >= cfg.critic_warmup_steps:
                ptx_batch = next(ptx_batches) if ptx_batches is not None else None
                policy_lr = policy.lr
                step_metrics |= policy_step(policy, mb, share, cfg, ptx_batch, ranks) | {"lr/policy": policy_lr}
            step += 1
            for k, v in step_metrics.items():
                stats[k].append(v)
    return {k: float(np.mean(v)) for k, v in stats.items()}


def iteration_metrics(exp: Experience, update_stats: dict[str, float], iteration: int) -> dict[str, float]:
    """Fixed, grouped names; policy metrics are 0 while the critic warms up alone."""
    mask = exp.response_mask.float()
    gold = {} if exp.gold is None else {"objective/gold": exp.gold.mean().item()}
    return gold | {
        "objective/score": exp.scores.mean().item(),
        "objective/score_shaped": exp.shaped_scores.mean().item(),
        "objective/return": exp.returns[:, 0].mean().item(),  # the return from each response's first token
        # of the sampled responses under the policy that sampled them (Part I watches it for collapse)
        "objective/perplexity": torch.exp(-masked_mean(exp.logp, mask)).item(),
        "objective/kl": exp.kl.sum(1).mean().item(),
        "objective/entropy": masked_mean(exp.entropy, mask).item(),
        "policy/approx_kl": update_stats.get("policy/approx_kl", 0.0),
        "policy/clipfrac": update_stats.get("policy/clipfrac", 0.0),
        "loss/policy": update_stats.get("loss/policy", 0.0),
        "loss/ptx": update_stats.get("loss/ptx", 0.0),
        "loss/entropy_bonus": update_stats.get("loss/entropy_bonus", 0.0),
        "loss/value": update_stats["loss/value"],
        "value/explained_variance": explained_variance(exp.values, exp.returns, mask),
        "value/error": update_stats["value/error"],
        "value/clipfrac": update_stats["value/clipfrac"],
        # the mean rate of this iteration's steps (0 for the policy while the critic warms up alone)
        "lr/policy": update_stats.get("lr/policy", 0.0),
        "lr/critic": update_stats["lr/critic"],
        "response/length": mask.sum(1).mean().item(),
        "iteration": iteration,
    }


def pretraining_batches(encoded: list[tuple[list[int], int]], size: int, pad_token_id: int,
                        seed: int, device: torch.device | None = None) -> Iterator[dict]:
    """Endless LM batches (labels only on responses) over seeded shuffles of the ptx examples."""
    rng = np.random.default_rng(seed + 1)
    while True:
        order = rng.permutation(len(encoded))
        for start in range(0, len(order) - size + 1 if len(order) >= size else 1, size):
            batch = collate([encoded[i] for i in order[start : start + size]], pad_token_id)
            yield {k: v.to(device) for k, v in batch.items()}


def prompt_batches(prompts: list[str], size: int, rng: np.random.Generator) -> Iterator[list[str]]:
    """Endless batches of `size` prompts: a fresh seeded shuffle each pass over the pool."""
    stream = itertools.chain.from_iterable(rng.permutation(len(prompts)) for _ in itertools.count())
    while True:
        yield [prompts[i] for i in itertools.islice(stream, size)]


def train_ppo(
    policy_dir: str | Path,
    reward_fn: RewardFn,
    prompts: list[str],
    cfg: PPOConfig,
    seed: int,
    critic_init_dir: str | Path | None = None,
    on_iteration: Callable[[dict[str, float]], None] | None = None,
    progress: bool = False,
    ptx_examples: list[tuple[str, str]] | None = None,
    gold_fn: RewardFn | None = None,
    checkpoint_dir: str | Path | None = None,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | None = None,
    deepspeed: dict | None = None,
    on_resume: Callable[[int], None] | None = None,
    reference_dir: str | Path | None = None,
) -> tuple[nn.Module, object, list[dict[str, float]]]:
    """PPO-max fine-tuning of the policy in `policy_dir` against `reward_fn`, KL-penalised towards the frozen
    policy in `reference_dir` (the SFT policy; None = `policy_dir`: round 1 starts from SFT, a later round from
    another policy but still anchored to SFT).

    ptx_examples: (prompt, response) pretraining/SFT data for the ptx loss (needed when
    cfg.ptx_coef > 0). gold_fn: the true reward where it is known (the simulated world), logged as
    objective/gold and never trained on. checkpoint_dir: where a checkpoint is written every
    cfg.checkpoint_every iterations; a checkpoint found there is resumed, and the iterations it
    holds are passed to `on_iteration` again first, then `on_resume` gets their number. Returns (policy,
    tokenizer, history), one metrics dict per iteration. Deterministic for a given seed on a given machine,
    resumed or not.

    Data parallel when world_size > 1 (torch.distributed initialised, e.g. by the ppo worker): this rank
    samples and scores its contiguous share of each rollout's prompts, every rank gets the whole rollout,
    and steps on its rows of each minibatch with gradients summed over ranks (see the module's docstring);
    only rank 0 writes checkpoints. Each prompt's responses are drawn with a seed of its index in the
    rollout (`sample_seeds`), so N ranks sample what one process samples. `device`: where the models and
    tensors live (a worker rank's GPU); None = `default_device()` (the GPU when one is present). The reward
    and gold functions take this rank's rows and may return their scores on any device. `deepspeed`: a
    DeepSpeed JSON config (ZeRO stage 1, 2 or 3; the ppo worker's, when launched with one): the policy and the
    critic then train through DeepSpeed engines (`DeepSpeedLearner`), the same steps; the reference stays a
    plain module.
    """
    if cfg.ptx_coef > 0 and not ptx_examples:
        raise ValueError("ppo.ptx_coef > 0 needs ptx_examples (the SFT data); pass them or set ptx_coef: 0")
    if not prompts:  # prompt_batches would wait forever for a first batch
        raise ValueError("train_ppo needs at least one prompt; the prompt pool is empty")
    torch.manual_seed(seed)
    ranks = Ranks(rank, world_size)
    device = device or default_device()
    tokenizer = load_tokenizer(policy_dir)
    total_steps = cfg.iterations * cfg.steps_per_iteration
    learner = Learner.build
    if deepspeed is not None:
        ds_config = engine_config(deepspeed, cfg.max_grad_norm)
        learner = lambda *args: DeepSpeedLearner.build(*args, config=ds_config)  # noqa: E731
    # eval(): no dropout, so the first PPO epoch starts exactly at ratio = 1.
    policy = learner(load_policy(policy_dir).to(device).eval(), cfg.policy_lr, cfg.lr_schedule,
                           cfg.policy_lr_warmup_steps, total_steps - cfg.critic_warmup_steps)
    reference = load_policy(reference_dir or policy_dir).to(device).eval().requires_grad_(False)  # frozen
    use_reward_model = cfg.critic_from_reward_model and critic_init_dir is not None
    critic = learner(build_critic(policy_dir, critic_init_dir if use_reward_model else None).to(device).eval(),
                           cfg.critic_lr, cfg.lr_schedule, cfg.critic_lr_warmup_steps, total_steps)
    moments = RunningMoments()
    kl_control = None if cfg.kl_target is None else AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    gen = torch.Generator().manual_seed(seed)  # minibatch shuffles

    checkpoint = Checkpoint(checkpoint_dir, cfg, seed) if checkpoint_dir is not None else None
    history: list[dict[str, float]] = []
    if checkpoint is not None and checkpoint.exists():
        history = checkpoint.restore(policy, critic, moments, kl_control, gen)
        for metrics in history:
            if on_iteration is not None:
                on_iteration(metrics)
        if on_resume is not None:
            on_resume(len(history))
    start = len(history)
    # the data streams are pure functions of the seed: a resumed run skips what was consumed
    batches = prompt_batches(list(prompts), cfg.rollout_prompts, np.random.default_rng(seed))
    for _ in range(start):
        next(batches)
    ptx_batches = None
    if cfg.ptx_coef > 0:
        encoded = [encode_example(tokenizer, p, r) for p, r in ptx_examples]
        ptx_batches = pretraining_batches(encoded, cfg.ptx_batch_size, tokenizer.pad_token_id, seed, device)
        for _ in range(max(0, start * cfg.steps_per_iteration - cfg.critic_warmup_steps)):  # one per policy step
            next(ptx_batches)

    own_prompts = ranks.shard(cfg.rollout_prompts)
    k = cfg.responses_per_prompt
    own_rows = range(own_prompts.start * k, own_prompts.stop * k)  # a prompt's responses are consecutive rows
    bar = progress_bar(range(start, cfg.iterations), initial=start, total=cfg.iterations, disable=not progress,
                       desc="ppo")
    for it in bar:
        batch = next(batches)
        local = rollout(policy.full_model(), reference, critic.model, tokenizer, reward_fn,
                        [batch[i] for i in own_prompts for _ in range(k)], cfg,
                        [s for i in own_prompts for s in sample_seeds(seed, it, i, k)], gold_fn)
        exp = gather_experience(local, ranks, tokenizer.pad_token_id)
        kl_coef = cfg.kl_coef if kl_control is None else kl_control.value
        exp = compute_advantages(exp, moments, cfg, kl_coef)
        stats = update(policy, critic, exp, cfg, it * cfg.steps_per_iteration, gen, ptx_batches, ranks, own_rows)
        metrics = iteration_metrics(exp, stats, it) | {"objective/kl_coef": kl_coef}
        if kl_control is not None:  # the next rollout's coefficient, from this one's KL
            kl_control.update(metrics["objective/kl"], n_steps=exp.response_ids.shape[0])
        history.append(metrics)
        if checkpoint is not None and cfg.checkpoint_every and (it + 1) % cfg.checkpoint_every == 0:
            checkpoint.save(history, policy, critic, moments, kl_control, gen, ranks)
        bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in PROGRESS_KEYS if k in metrics}, refresh=False)
        if on_iteration is not None:
            on_iteration(metrics)
    return policy.full_model(), tokenizer, history


PROGRESS_KEYS = ("objective/score", "objective/gold", "objective/kl", "objective/perplexity")


class Checkpoint:
    """The whole training state, `<directory>/checkpoint.pt`, replaced atomically.

    It holds what the next iteration depends on: policy and critic weights with their optimiser
    and schedule states, the running reward moments, the adaptive KL coefficient, the minibatch
    shuffle's RNG state and the metrics so far (their count is the data position). The config and
    seed are stored too, and a checkpoint of another run is refused rather than resumed.

    Under DeepSpeed (`DeepSpeedLearner`) each rank holds a partition of the optimiser state: every rank
    writes its own with the engine's save_checkpoint into `<directory>/deepspeed/iteration-<n>/`, and
    checkpoint.pt, written last, names that directory; older ones are removed only after it is replaced,
    so a kill at any moment leaves a complete checkpoint. Such a checkpoint resumes on as many ranks, under
    DeepSpeed; a plain one on any number of ranks, without.
    """

    def __init__(self, directory: str | Path, cfg: PPOConfig, seed: int):
        self.path = Path(directory) / "checkpoint.pt"
        self.engines = Path(directory) / "deepspeed"
        # the number of ranks is left out: a run killed on N ranks resumes on any number
        self.run = {"config": cfg.model_dump(mode="json", context=RESOLVED, exclude=EXECUTION_SETTINGS), "seed": seed}

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, history, policy: Learner, critic: Learner, moments: RunningMoments,
             kl_control: AdaptiveKLController | None, gen: torch.Generator, ranks: Ranks = Ranks()) -> None:
        """Called on every rank (DeepSpeed's engines write a partition each); rank 0 writes checkpoint.pt."""
        engines = self.engines / f"iteration-{len(history)}"
        state = {
            "run": self.run, "history": history, "zero_ranks": policy.zero_ranks,
            "policy": policy.save(engines, "policy"), "critic": critic.save(engines, "critic"),
            "moments": {"count": moments.count, "mean": moments.mean, "m2": moments.m2},
            "kl_coef": None if kl_control is None else kl_control.value,
            "minibatch_rng": gen.get_state(), "torch_rng": torch.get_rng_state(),
        }
        if ranks.rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda f: torch.save(state, f))
        for old in self.engines.glob("iteration-*"):
            if old != engines:
                shutil.rmtree(old)

    def restore(self, policy: Learner, critic: Learner, moments: RunningMoments,
                kl_control: AdaptiveKLController | None, gen: torch.Generator) -> list[dict[str, float]]:
        state = torch.load(self.path, weights_only=True, map_location="cpu")
        if state["run"] != self.run:
            raise ValueError(f"{self.path} was written by another PPO run (different config or seed): "
                             "delete it to start over, or resume with the config and seed that wrote it")
        if state.get("zero_ranks") != policy.zero_ranks:
            raise ValueError(f"{self.path} was written {_engines(state.get('zero_ranks'))}; this run trains "
                             f"{_engines(policy.zero_ranks)}: ZeRO partitions the optimiser state over the ranks, "
                             "so resume with the ppo.deepspeed and ppo.num_processes that wrote it, or delete "
                             f"{self.path.parent} to start over")
        engines = self.engines / f"iteration-{len(state['history'])}"
        policy.restore(engines, state["policy"])
        critic.restore(engines, state["critic"])
        moments.count, moments.mean, moments.m2 = (state["moments"][k] for k in ("count", "mean", "m2"))
        if kl_control is not None:
            kl_control.value = state["kl_coef"]
        gen.set_state(state["minibatch_rng"])
        torch.set_rng_state(state["torch_rng"])
        return state["history"]


def _engines(zero_ranks: int | None) -> str:
    return "without DeepSpeed" if zero_ranks is None else f"under DeepSpeed ZeRO on {zero_ranks} ranks"
