"""Training a reward model on preference pairs (Bradley-Terry, margins, soft labels, LM imitation)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from rlhf_core import models
from rlhf_core.config import RewardTrainConfig
from rlhf_core.reward.losses import imitation_loss, preference_loss, smooth_labels
from rlhf_core.reward.model import RewardModel, encode, score_texts

REQUIRED_COLUMNS = ("prompt", "chosen", "rejected")


def _pair_batch(tokenizer, pairs: pd.DataFrame, max_length: int) -> dict[str, torch.Tensor]:
    """Chosen then rejected in one batch: rows [0, B) are chosen, rows [B, 2B) rejected. (2B, T)"""
    prompts = pairs["prompt"].tolist()
    return encode(tokenizer, prompts + prompts, pairs["chosen"].tolist() + pairs["rejected"].tolist(), max_length)


def _optional_column(pairs: pd.DataFrame, name: str) -> torch.Tensor | None:
    if name not in pairs.columns:
        return None
    return torch.tensor(pairs[name].to_numpy(dtype=np.float32))  # (B,)


def make_optimizer(model: RewardModel, cfg: RewardTrainConfig) -> torch.optim.Optimizer:
    """AdamW: the trunk at cfg.lr, the fresh head and the log-likelihood weight at cfg.head_lr.

    A small lr keeps what the trunk knows (its next-token prediction is half the reward), while
    the head starts from noise and must move fast.
    """
    head = list(model.head().parameters()) + ([model.logprob_weight] if model.logprob_weight.requires_grad else [])
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
    """
    B = len(pairs)
    hidden = model.hidden_states(batch["input_ids"], batch["attention_mask"])  # (2B, T, H)
    rewards = model.rewards_from_hidden(hidden, batch)  # (2B,)
    soft = _optional_column(pairs, "soft_label")
    if cfg.label_smoothing:
        soft = smooth_labels(torch.ones(B) if soft is None else soft, cfg.label_smoothing)
    loss, metrics = preference_loss(rewards[:B], rewards[B:], margin=_optional_column(pairs, "margin"),
                                    soft_label=soft)
    if cfg.lm_coef:
        chosen = {k: v[:B] for k, v in batch.items()}
        lm = imitation_loss(model.response_logprob(hidden[:B], chosen), chosen["response_mask"][:, 1:].sum(1))
        loss = loss + cfg.lm_coef * lm
        metrics["lm_loss"] = lm.item()
    return loss, metrics


def train_reward_model(
    init_dir: str | Path,
    pairs: pd.DataFrame,
    cfg: RewardTrainConfig,
    seed: int,
    progress: bool = False,
) -> tuple[RewardModel, PreTrainedTokenizerBase, dict[str, float]]:
    """Train a reward model initialised from the policy in `init_dir` on `pairs`.

    pairs: columns prompt, chosen, rejected; optional soft_label (target P(chosen > rejected))
    and margin, passed to `preference_loss`. The seed sets the head init and the data order of
    every epoch, so two seeds differ in both. AdamW (see `make_optimizer`) with a linear decay
    of the learning rates to 0 over all steps and global gradient clipping.

    Returns (model in eval mode, tokenizer, metrics): loss and accuracy are means over the last
    epoch's batches (as trained, not re-scored); logprob_weight; steps; seconds.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack column(s) {missing}; present: {list(pairs.columns)}")
    if len(pairs) == 0:
        raise ValueError("no pairs to train on")
    t0 = time.perf_counter()
    model = RewardModel.from_policy(init_dir, seed, cfg.read)  # seeds torch, then draws the head
    tokenizer = models.load_tokenizer(init_dir)
    torch.manual_seed(seed)
    order_rng = np.random.default_rng(seed)

    n_batches = -(-len(pairs) // cfg.batch_size)
    total_steps = cfg.epochs * n_batches
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / total_steps)

    model.train()
    bar = tqdm(total=total_steps, desc=f"reward seed={seed}", disable=not progress, leave=False)
    step = 0
    for _ in range(cfg.epochs):
        order = order_rng.permutation(len(pairs))
        epoch_loss, epoch_acc = [], []
        for start in range(0, len(pairs), cfg.batch_size):
            batch_pairs = pairs.iloc[order[start : start + cfg.batch_size]]
            loss, metrics = pair_loss(model, _pair_batch(tokenizer, batch_pairs, cfg.max_length), batch_pairs, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            epoch_loss.append(loss.item())
            epoch_acc.append(metrics["accuracy"])
            bar.update(1)
            bar.set_postfix(loss=f"{epoch_loss[-1]:.3f}")
    bar.close()
    model.eval()
    metrics = {
        "loss": float(np.mean(epoch_loss)),
        "accuracy": float(np.mean(epoch_acc)),
        "logprob_weight": float(model.logprob_weight.item()),
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
