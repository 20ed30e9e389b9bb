"""Training a reward model on preference pairs (Bradley-Terry, margins, soft labels, LM imitation,
SimCSE contrastive loss, MetaRM's meta step)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase

from rlhf_core import models
from rlhf_core.config import REWARD_DATA_PARALLEL_LIMITS, RewardTrainConfig
from rlhf_core.progress import progress_bar
from rlhf_core.reward.losses import (
    contrastive_samples,
    difference_loss,
    imitation_loss,
    info_nce,
    preference_loss,
    smooth_labels,
)
from rlhf_core.reward.model import RewardModel, encode, encode_rows, right_padded, score_texts

REQUIRED_COLUMNS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class EncodedPairs:
    """Every pair's chosen and rejected token ids, unpadded, tokenised once before training (`encode_pairs`);
    `pair_batch` (or `shared_prompt_batch`) pads a batch of them. response_*: each row's response tokens, eos
    included; prompt: the tokens both rows share at their start before either's response (`shared_prompt_length`)."""

    chosen: list[list[int]]
    rejected: list[list[int]]
    chosen_response: list[int]
    rejected_response: list[int]
    prompt: list[int]
    pad_id: int

    def lengths(self) -> np.ndarray:
        """(N,) tokens of each pair's longer side: its chosen and rejected are padded together."""
        return np.array([max(len(c), len(r)) for c, r in zip(self.chosen, self.rejected)], dtype=np.int64)

    def batching_lengths(self, share_prompt: bool) -> np.ndarray:
        """(N,) what `length_grouped` batching sorts by: the longer side, or with the prompt shared, the prompt
        (the replies are regrouped by length inside the batch, `shared_prompt_batch`)."""
        return np.array(self.prompt, dtype=np.int64) if share_prompt else self.lengths()


def shared_prompt_length(chosen: list[int], rejected: list[int], n_chosen: int, n_rejected: int) -> int:
    """Tokens at the start of both rows before either's response: the query, fewer where left truncation cut the
    two rows differently (then possibly 0)."""
    limit = min(len(chosen) - n_chosen, len(rejected) - n_rejected)
    n = 0
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    return n


def encode_pairs(tokenizer, pairs: pd.DataFrame, max_length: int) -> EncodedPairs:
    """Tokenise every pair of `pairs` once (`encode_rows`: the ids `encode` gives, before padding)."""
    prompts = pairs["prompt"].tolist()
    chosen, chosen_response = encode_rows(tokenizer, prompts, pairs["chosen"].tolist(), max_length)
    rejected, rejected_response = encode_rows(tokenizer, prompts, pairs["rejected"].tolist(), max_length)
    prompt = [shared_prompt_length(*row) for row in zip(chosen, rejected, chosen_response, rejected_response)]
    return EncodedPairs(chosen, rejected, chosen_response, rejected_response, prompt, tokenizer.pad_token_id)


def pair_batch(encoded: EncodedPairs, rows: np.ndarray, device: torch.device | None = None
               ) -> dict[str, torch.Tensor]:
    """Pairs `rows` of `encoded`, chosen then rejected in one batch: rows [0, B) are chosen, rows [B, 2B)
    rejected, right-padded together to the longest. (2B, T)"""
    ids = [encoded.chosen[i] for i in rows] + [encoded.rejected[i] for i in rows]
    n_response = [encoded.chosen_response[i] for i in rows] + [encoded.rejected_response[i] for i in rows]
    batch = right_padded(ids, n_response, encoded.pad_id)
    return batch if device is None else {k: v.to(device) for k, v in batch.items()}


def shared_prompt_batch(encoded: EncodedPairs, rows: np.ndarray, group_rows: int,
                        device: torch.device | None = None) -> dict:
    """Pairs `rows` of `encoded` for `RewardModel.shared_prompt_rewards`: each pair's shared prompt once,
    right-padded (B, P), with `prompt_groups`, the prompt rows sorted by length and cut into groups of `group_rows`
    (each pass runs to its own longest prompt), and the 2B continuations (chosen rows first) sorted by length and
    cut into groups of `group_rows`, each right-padded to its own longest. With tokenisers that do not split the
    prompt's end differently on the two sides this is the query once and each reply: fewer tokens than
    `pair_batch`'s 2B rows padded to the longest (on HH-RLHF, prompts are 157 of a side's mean 265 tokens)."""
    B = len(rows)
    prompts = [encoded.chosen[i][: encoded.prompt[i]] for i in rows]
    P = max(1, max(len(p) for p in prompts))  # one padding column if every prompt is empty
    prompt_ids = torch.full((B, P), encoded.pad_id, dtype=torch.long)  # (B, P)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)  # (B, P)
    for j, p in enumerate(prompts):
        if p:
            prompt_ids[j, : len(p)] = torch.tensor(p, dtype=torch.long)
            prompt_mask[j, : len(p)] = 1
    tails = ([encoded.chosen[i][encoded.prompt[i]:] for i in rows]
             + [encoded.rejected[i][encoded.prompt[i]:] for i in rows])  # reply and eos, after the shared prompt
    n_response = [encoded.chosen_response[i] for i in rows] + [encoded.rejected_response[i] for i in rows]
    pair = np.concatenate([np.arange(B), np.arange(B)])  # (2B,) the prompt row each continuation follows
    continuations = []
    for part in _by_length_in_groups([len(t) for t in tails], group_rows):
        group = right_padded([tails[k] for k in part], [n_response[k] for k in part], encoded.pad_id)
        group |= {"pair": torch.as_tensor(pair[part]), "row": torch.as_tensor(part)}
        continuations.append(group if device is None else {k: v.to(device) for k, v in group.items()})
    prompt_groups = [torch.as_tensor(part) for part in _by_length_in_groups([len(p) for p in prompts], group_rows)]
    if device is not None:
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        prompt_groups = [g.to(device) for g in prompt_groups]
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "prompt_groups": prompt_groups,
            "continuations": continuations}


def _by_length_in_groups(lengths: list[int], group_rows: int) -> list[np.ndarray]:
    """Indices into `lengths`, shortest first (ties in order), cut into groups of `group_rows`: rows of similar
    length share a pass and pad little."""
    order = np.argsort(lengths, kind="stable")
    return [order[start : start + group_rows] for start in range(0, len(order), group_rows)]


def training_batch(encoded: EncodedPairs, rows: np.ndarray, cfg: RewardTrainConfig,
                   device: torch.device | None = None) -> dict:
    """The batch the model's call takes for pairs `rows`: `shared_prompt_batch` with cfg.share_prompt, else
    `pair_batch`."""
    if cfg.share_prompt:
        return shared_prompt_batch(encoded, rows, cfg.share_prompt_group_rows, device)
    return pair_batch(encoded, rows, device)


def epoch_batches(n: int, cfg: RewardTrainConfig, rng: np.random.Generator, lengths: np.ndarray
                  ) -> list[np.ndarray]:
    """One epoch's batches of row indices, cfg.batch_size pairs each (the last may be smaller), drawn from `rng`.

    random: a permutation cut into batches. length_grouped (transformers' `get_length_grouped_indices`): the
    permutation cut into mega-batches of m batches (m = 50, fewer so that there are at least 4 mega-batches),
    each sorted by `lengths` (N,), longest first, and cut into batches; then the batches are shuffled, so
    the order stays seeded and random at the batch level while a batch pads to a similar length.
    """
    order = rng.permutation(n)
    if cfg.batching == "random":
        return [order[start : start + cfg.batch_size] for start in range(0, n, cfg.batch_size)]
    mega = cfg.batch_size * max(1, min(n // (4 * cfg.batch_size), 50))
    batches = []
    for start in range(0, n, mega):
        rows = order[start : start + mega]
        rows = rows[np.argsort(-lengths[rows], kind="stable")]
        batches += [rows[i : i + cfg.batch_size] for i in range(0, len(rows), cfg.batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _pair_batch(tokenizer, pairs: pd.DataFrame, max_length: int, device: torch.device | None = None
                ) -> dict[str, torch.Tensor]:
    """`pair_batch` of all of `pairs`, tokenised now (for callers that score a batch once). (2B, T)"""
    return pair_batch(encode_pairs(tokenizer, pairs, max_length), np.arange(len(pairs)), device)


def _optional_column(pairs: pd.DataFrame, name: str, device: torch.device | None = None) -> torch.Tensor | None:
    if name not in pairs.columns:
        return None
    return torch.tensor(pairs[name].to_numpy(dtype=np.float32), device=device)  # (B,)


def make_optimizer(model: RewardModel, cfg: RewardTrainConfig) -> torch.optim.Optimizer:
    """AdamW: the trunk at cfg.lr, the fresh head and the log-likelihood weight at cfg.head_lr.

    A small lr keeps what the trunk knows (its next-token prediction is half the reward), while
    the head starts from noise and must move fast.
    """
    head = list(model.head().parameters()) + ([model.logprob_weight] if model.logprob_weight.requires_grad else [])
    if model.token_weight is not None:
        head += list(model.token_weight.parameters())
    head_ids = {id(p) for p in head}
    trunk = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    return torch.optim.AdamW(
        [{"params": trunk, "lr": cfg.lr}, {"params": head, "lr": cfg.head_lr or cfg.lr}],
        weight_decay=cfg.weight_decay,
    )


def pair_loss(model: RewardModel, batch: dict[str, torch.Tensor], pairs: pd.DataFrame, cfg: RewardTrainConfig
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one batch of pairs (chosen rows first, see `_pair_batch`).

        loss = BT(r_c - r_r - margin; smooth(p, eps)) + lm_coef * NLL(chosen)
               + contrastive.coef * InfoNCE(view 1, view 2)

    The contrastive term encodes the batch a second time; in train mode dropout makes the two views
    differ (SimCSE), and the samples are the responses or the pairs' differences (see `contrastive_samples`).
    """
    B = len(pairs)
    if cfg.lm_coef or cfg.contrastive.coef:  # they read the hidden states too: one trunk pass for all
        hidden = model.hidden_states(batch["input_ids"], batch["attention_mask"])  # (2B, T, H)
        rewards = model.rewards_from_hidden(hidden, batch)  # (2B,)
    else:  # the model's own call: under ZeRO-3 its hooks gather every weight the reward reads
        rewards = model(**batch)  # (2B,)
    device = rewards.device
    soft = _optional_column(pairs, "soft_label", device)
    if cfg.label_smoothing:
        soft = smooth_labels(torch.ones(B, device=device) if soft is None else soft, cfg.label_smoothing)
    loss, metrics = preference_loss(rewards[:B], rewards[B:], margin=_optional_column(pairs, "margin", device),
                                    soft_label=soft)
    if cfg.lm_coef:
        chosen = {k: v[:B] for k, v in batch.items()}
        lm = imitation_loss(model.response_logprob(hidden[:B], chosen), chosen["response_mask"][:, 1:].sum(1))
        loss = loss + cfg.lm_coef * lm
        metrics["lm_loss"] = lm.item()
    contrastive = cfg.contrastive
    if contrastive.coef:
        view_1 = model.end_hidden(hidden, batch)  # (2B, H)
        view_2 = model.end_hidden(model.hidden_states(batch["input_ids"], batch["attention_mask"]), batch)
        cl = info_nce(contrastive_samples(view_1[:B], view_1[B:], contrastive.positives),
                      contrastive_samples(view_2[:B], view_2[B:], contrastive.positives), contrastive.temperature)
        loss = loss + contrastive.coef * cl
        metrics["contrastive_loss"] = cl.item()
    return loss, metrics


def meta_groups(samples: pd.DataFrame, k: int) -> list[tuple[str, list[str]]]:
    """(prompt, its distinct responses) for every prompt of `samples` with at least k distinct responses."""
    missing = [c for c in ("prompt", "response") if c not in samples.columns]
    if missing:
        raise ValueError(f"MetaRM samples lack column(s) {missing}; present: {list(samples.columns)}")
    groups = [(prompt, list(dict.fromkeys(g["response"]))) for prompt, g in samples.groupby("prompt", sort=True)]
    groups = [(prompt, responses) for prompt, responses in groups if len(responses) >= k]
    if not groups:
        raise ValueError(f"MetaRM needs prompts with at least {k} distinct policy samples "
                         f"(reward.train.meta.samples_per_prompt); none of {samples['prompt'].nunique()} has")
    return groups


def meta_batch(tokenizer, groups: list[tuple[str, list[str]]], cfg: RewardTrainConfig, rng: np.random.Generator
               ) -> dict[str, torch.Tensor]:
    """cfg.meta.prompts_per_step prompts, k of each one's samples: (P * k, T), prompt by prompt."""
    k = cfg.meta.samples_per_prompt
    chosen = rng.choice(len(groups), size=min(cfg.meta.prompts_per_step, len(groups)), replace=False)
    prompts, responses = [], []
    for g in chosen:
        prompt, candidates = groups[g]
        prompts += [prompt] * k
        responses += [candidates[i] for i in rng.choice(len(candidates), size=k, replace=False)]
    return encode(tokenizer, prompts, responses, cfg.max_length)


def meta_ascent(model: RewardModel, batch: dict[str, torch.Tensor], k: int, inner_lr: float, max_grad_norm: float
                ) -> tuple[list[torch.Tensor], float]:
    """MetaRM's inner step, in place: theta' = theta + inner_lr * clip(grad J(theta)).

    J is `difference_loss` of the batch's rewards viewed (P, k). Returns the shift of every trainable
    parameter and J (`step_gradients` keeps theta to restore it exactly). The outer gradient is then taken
    at theta' and applied to theta: the first-order form of Algorithm 1 (the term through d theta' / d theta, a
    Hessian-vector product, is left out, as first-order MAML does).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    j = difference_loss(model(**batch).view(-1, k))
    grads = torch.autograd.grad(j, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = inner_lr * min(1.0, max_grad_norm / (norm.item() + 1e-6))
    shifts = [scale * g for g in grads]
    with torch.no_grad():
        for p, shift in zip(params, shifts):
            p.add_(shift)
    return shifts, j.item()


def step_gradients(model: RewardModel, batch: dict[str, torch.Tensor], pairs: pd.DataFrame, cfg: RewardTrainConfig,
                   meta: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Accumulate one step's gradients into .grad; the weights are unchanged when it returns.

    Without `meta`: the gradient of `pair_loss`. With a MetaRM batch (P * k policy samples, see
    `meta_batch`): shift to theta' (`meta_ascent`), take the gradient of `pair_loss` there, shift back.
    """
    theta = []
    extra = {}
    if meta is not None:
        # theta itself, not theta' - shift: in float32 (p + s) - s is not p, and the error would build up over steps
        theta = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        _, extra["meta_difference"] = meta_ascent(model, meta, cfg.meta.samples_per_prompt, cfg.meta.inner_lr,
                                                  cfg.max_grad_norm)
    loss, metrics = pair_loss(model, batch, pairs, cfg)
    loss.backward()
    with torch.no_grad():
        for p, weights in zip((p for p in model.parameters() if p.requires_grad), theta):
            p.copy_(weights)  # back to theta: the outer gradient is applied to the unshifted weights
    return loss, metrics | extra


def rank_shard(global_rows: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous share of a global batch's rows (sizes differ by at most 1; may be empty)."""
    return np.array_split(global_rows, world_size)[rank]


def shard_loss(model: RewardModel, encoded: EncodedPairs, pairs: pd.DataFrame, shard: np.ndarray, global_size: int,
               cfg: RewardTrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of a global batch's mean loss, and its part of (loss, accuracy) as float64 (2,).
    `shard`: this rank's rows of `pairs` (and of `encoded`, their tokens).

    Each rank's loss, a mean over its n pairs, is weighted n / global_size, so the sum over ranks is the
    mean over the global batch whatever the shard sizes.
    """
    device = next(model.parameters()).device
    # a last batch smaller than the world leaves this rank no rows: it still runs the same forward and backward
    # as the others (ZeRO-3 gathers weights in them, ZeRO reduces gradients in backward order), on a stand-in,
    # the first pair, weighted 0
    weight = len(shard) / global_size
    shard = shard if len(shard) else np.arange(1)
    loss, metrics = pair_loss(model, training_batch(encoded, shard, cfg, device), pairs.iloc[shard], cfg)
    totals = torch.tensor([weight * loss.item(), weight * metrics["accuracy"]], dtype=torch.float64, device=device)
    return weight * loss, totals


def shard_gradients(model: RewardModel, encoded: EncodedPairs, pairs: pd.DataFrame, shard: np.ndarray,
                    global_size: int, cfg: RewardTrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """One data-parallel step's gradients: the global batch's mean-loss gradient, in .grad on every rank.
    Returns the global batch's loss and accuracy."""
    params = [p for p in model.parameters() if p.requires_grad]
    loss, totals = shard_loss(model, encoded, pairs, shard, global_size, cfg)
    loss.backward()
    for p in params:
        if p.grad is None:  # not on this batch's path (e.g. the LM head with lm_coef 0): the sum needs it
            p.grad = torch.zeros_like(p)
    all_reduce_gradients(params)
    return global_metrics(totals)


def deepspeed_step(accelerator, model, encoded: EncodedPairs, pairs: pd.DataFrame, shard: np.ndarray,
                   global_size: int, cfg: RewardTrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """One data-parallel step through DeepSpeed's engine, which averages the gradients over the ranks,
    clips them and steps the optimizer (accelerate's optimizer wrapper's own step then does nothing).
    The loss is scaled by the world size so that its average is the sum `shard_gradients` takes; every rank
    runs the same forward and backward (see `shard_loss`)."""
    loss, totals = shard_loss(model, encoded, pairs, shard, global_size, cfg)
    accelerator.backward(loss * accelerator.num_processes)
    return global_metrics(totals)


def gathered_copy(partitioned: RewardModel, whole: RewardModel) -> RewardModel:
    """`whole` (the same architecture, not partitioned) with the weights of a ZeRO-3 model, gathered one at a
    time: a collective, every rank calls it. A (1,)-shaped stand-in of a 0-dim weight takes its 0-dim shape."""
    from deepspeed.runtime.zero import GatheredParameters

    weights = dict(whole.named_parameters())
    with torch.no_grad():
        for name, weight in partitioned.named_parameters():
            with GatheredParameters([weight]):
                weights[name].copy_(weight.reshape(weights[name].shape))
    return whole


def global_metrics(totals: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, {"accuracy"}) of the global batch: the ranks' parts summed."""
    torch.distributed.all_reduce(totals)
    return totals[0].to(torch.float32), {"accuracy": totals[1].item()}


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum every gradient over the ranks, in one flat buffer (one collective per step, not one per tensor)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # (n_params,)
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def train_reward_model(
    init_dir: str | Path,
    pairs: pd.DataFrame,
    cfg: RewardTrainConfig,
    seed: int,
    progress: bool = False,
    meta_samples: pd.DataFrame | None = None,
    rank: int = 0,
    world_size: int = 1,
    deepspeed=None,
    device: torch.device | None = None,
    section: str = "reward.train",
) -> tuple[RewardModel, PreTrainedTokenizerBase, dict[str, float]]:
    """Train a reward model initialised from the policy in `init_dir` on `pairs`. `section`: where `cfg` is in the
    round's config (voting's voters: voting.train), named by the errors.

    pairs: columns prompt, chosen, rejected; optional soft_label (target P(chosen > rejected))
    and margin, passed to `preference_loss`. The seed sets the head init and the data order of
    every epoch, so two seeds differ in both. AdamW (see `make_optimizer`) with a linear decay
    of the learning rates to 0 over all steps and global gradient clipping. The pairs are tokenised once
    (`encode_pairs`); each epoch's batches come from `epoch_batches` (cfg.batching) and are padded from those ids
    (`training_batch`: with cfg.share_prompt each pair's prompt is run once for both replies).
    meta_samples (prompt, response): the policy samples of MetaRM, needed when cfg.meta.enabled;
    each step first ascends their difference loss (`meta_ascent`), then descends the pair loss
    at the shifted weights and applies that gradient to the unshifted ones.

    Data parallel when world_size > 1 (torch.distributed initialised, e.g. by the train_reward worker):
    every rank draws the same global batches and trains on its shard of each (`rank_shard`); the
    gradients are summed over ranks (`all_reduce_gradients`), so every step is the 1-rank step on the
    same global batch, up to float summation order, for a backbone without dropout (the simulated world's). With
    dropout (GPT-2, OPT, the BERT family: 0.1) each rank draws its masks from the same seed for its own shard, where
    one process draws them over the whole batch: N ranks train an equally valid model, not the same one (the
    reward stage then keys its cache on the number of ranks too). Losses that are not a mean over pairs are
    refused there (REWARD_DATA_PARALLEL_LIMITS; RewardConfig checks it first). `deepspeed`: the worker's
    Accelerator when launched with a DeepSpeed config (ZeRO); the model and optimizer then go through its
    prepare, and its engine takes the backward, the gradient average, the clipping and the optimizer step. Under
    ZeRO-3 the weights the model reads outside their module's call are registered with it (see
    `RewardModel.weights_read_outside_their_module`), and the model returned on every rank is built again whole
    with the trained weights gathered into it (`gathered_copy`).
    `device`: where the model and batches live (a worker rank's GPU); None = `models.default_device()` (the
    GPU when one is present). The model is returned there.

    Returns (model in eval mode, tokenizer, metrics): loss and accuracy are means over the last
    epoch's batches (as trained, not re-scored); contrastive_loss / meta_difference when on;
    logprob_weight; steps; seconds.
    """
    if (world_size > 1 or deepspeed is not None) and (cfg.contrastive.coef or cfg.meta.enabled or cfg.lm_coef):
        raise ValueError(REWARD_DATA_PARALLEL_LIMITS)
    missing = [c for c in REQUIRED_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack column(s) {missing}; present: {list(pairs.columns)}")
    if len(pairs) == 0:
        raise ValueError("no pairs to train on")
    t0 = time.perf_counter()
    device = device or models.default_device()
    model = RewardModel.from_policy(init_dir, seed, cfg.read).to(device)  # seeds torch, then draws the head
    tokenizer = models.load_tokenizer(init_dir)
    if cfg.lm_coef:
        model.require_tied_lm_head(f"the LM imitation loss ({section}.lm_coef)", f"set {section}.lm_coef 0")
    if cfg.contrastive.coef:
        dropout_modules = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
        attention_layers = model.set_attention_dropout(cfg.contrastive.dropout)
        if not dropout_modules and not attention_layers:
            raise ValueError("the contrastive loss needs dropout to make two views, and this backbone has no "
                             f"attention dropout to set nor dropout layers: set {section}.contrastive.coef 0")
        if not dropout_modules and cfg.contrastive.dropout == 0:  # two identical views: nothing to align
            raise ValueError("the contrastive loss needs dropout to make two views, and this backbone's only dropout "
                             f"is attention dropout: set {section}.contrastive.dropout above 0 (SimCSE: 0.1)")
    groups = None
    if cfg.meta.enabled:
        if meta_samples is None:
            raise ValueError(f"{section}.meta.enabled needs policy samples (prompt, response) to train with")
        groups = meta_groups(meta_samples, cfg.meta.samples_per_prompt)
    encoded = encode_pairs(tokenizer, pairs, cfg.max_length)  # once: every epoch's batches are padded from it
    torch.manual_seed(seed)
    order_rng = np.random.default_rng(seed)
    meta_rng = np.random.default_rng([seed, 1])  # its own stream: the pairs' order is the same with MetaRM off

    n_batches = -(-len(pairs) // cfg.batch_size)
    total_steps = cfg.epochs * n_batches
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / total_steps)
    if deepspeed is not None:
        # DeepSpeed 0.19.8 broadcasts every parameter viewed as bytes, which a 0-dim one cannot be
        scalars = [p for p in model.parameters() if p.dim() == 0]
        for p in scalars:
            p.data = p.data.reshape(1)
        deepspeed.state.deepspeed_plugin.deepspeed_config["gradient_clipping"] = cfg.max_grad_norm
        partitioned = deepspeed.state.deepspeed_plugin.zero_stage == 3  # ZeRO-3: the weights too
        if partitioned:
            from deepspeed.runtime.zero import register_external_parameter

            for weight in model.weights_read_outside_their_module():
                register_external_parameter(model, weight)
        # the schedule stays ours: accelerate's wrapper would step it once per rank at every step
        model, optimizer = deepspeed.prepare(model, optimizer)

    model.train()
    bar = progress_bar(total=total_steps, desc=f"reward seed={seed}", disable=not progress, leave=False)
    step = 0
    for _ in range(cfg.epochs):
        epoch_loss, epoch_acc, epoch_extra = [], [], {}
        for global_rows in epoch_batches(len(pairs), cfg, order_rng, encoded.batching_lengths(cfg.share_prompt)):
            shard = rank_shard(global_rows, rank, world_size)
            optimizer.zero_grad(set_to_none=True)
            meta = None if groups is None else {k: v.to(device) for k, v in
                                                meta_batch(tokenizer, groups, cfg, meta_rng).items()}
            if deepspeed is not None:
                loss, metrics = deepspeed_step(deepspeed, model, encoded, pairs, shard, len(global_rows), cfg)
            else:
                if world_size == 1:
                    batch = training_batch(encoded, shard, cfg, device)
                    loss, metrics = step_gradients(model, batch, pairs.iloc[shard], cfg, meta)
                else:
                    loss, metrics = shard_gradients(model, encoded, pairs, shard, len(global_rows), cfg)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
            scheduler.step()
            step += 1
            epoch_loss.append(loss.item())
            epoch_acc.append(metrics["accuracy"])
            for name in ("contrastive_loss", "meta_difference"):
                if name in metrics:
                    epoch_extra.setdefault(name, []).append(metrics[name])
            bar.update(1)
            bar.set_postfix(loss=f"{epoch_loss[-1]:.3f}", refresh=False)
    bar.close()
    if deepspeed is not None:
        model = deepspeed.unwrap_model(model)
        if partitioned:  # a whole model on every rank, built again, the trained weights gathered into it
            whole = RewardModel.from_policy(init_dir, seed, cfg.read)
            model = gathered_copy(model, whole if device is None else whole.to(device))
        else:
            for p in scalars:
                p.data = p.data.reshape(())
    model.eval()
    metrics = {
        "loss": float(np.mean(epoch_loss)),
        "accuracy": float(np.mean(epoch_acc)),
        **{name: float(np.mean(values)) for name, values in epoch_extra.items()},
        "logprob_weight": float(model.logprob_weight.item()),
        # pairs with a row at max_length: cut from the left (their prompt's start lost), or exactly that long
        "share_at_max_length": float((encoded.lengths() >= cfg.max_length).mean()),
        "steps": step,
        "seconds": time.perf_counter() - t0,
    }
    return model, tokenizer, metrics


def pair_reward_diffs(model, tokenizer, pairs: pd.DataFrame, max_length: int, batch_size: int = 64) -> np.ndarray:
    """(N,) r(prompt, chosen) - r(prompt, rejected) per pair, no gradients."""
    prompts = pairs["prompt"].tolist()
    r_chosen = score_texts(model, tokenizer, prompts, pairs["chosen"].tolist(), max_length, batch_size)
    r_rejected = score_texts(model, tokenizer, prompts, pairs["rejected"].tolist(), max_length, batch_size)
    return (r_chosen - r_rejected).numpy().astype(np.float64)


def pairwise_accuracy(model, tokenizer, pairs: pd.DataFrame, max_length: int) -> float:
    """Share of pairs where r(chosen) > r(rejected)."""
    return float((pair_reward_diffs(model, tokenizer, pairs, max_length) > 0).mean())
