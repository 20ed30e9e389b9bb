"""The reward functions PPO trains and reports with: (prompts, responses) -> one score per response."""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf_core import models
from rlhf_core.reward.model import RewardModel, score_texts
from rlhf_core.sim.world import gold_score


def reward_scorer(reward_dir: str | Path, max_length: int, device: torch.device | str | None = None):
    """(prompts, responses) -> scores (B,) on the CPU, from a saved reward model run on `device` (None:
    `models.default_device()`)."""
    model = RewardModel.load(reward_dir).to(device or models.default_device())
    tokenizer = models.load_tokenizer(reward_dir)
    return lambda prompts, responses: score_texts(model, tokenizer, prompts, responses, max_length=max_length)


def gold_scores(prompts: list[str], responses: list[str]) -> list[float]:
    """The simulated world's true reward of each response: logged per iteration, never trained on."""
    return [gold_score(p, r) for p, r in zip(prompts, responses)]
