"""Preference strength by voting (Secrets of RLHF Part II, sec. 3.1).

M reward models are trained on the same pairs with different seeds (head init and data order).
For pair i and model m the preference strength is

    d[i, m] = r_m(prompt_i, chosen_i) - r_m(prompt_i, rejected_i)

and the pair's strength is mean_m d[i, m] with spread std_m d[i, m] (population std, Part II Eq. 4).

Two schemes:
- in_sample (the paper): every voter trains on every pair, then scores it;
- out_of_fold: the pairs are split into F folds (seeded); voter k trains on every fold but
  fold k mod F and the pair's mean and std are taken only over the voters that did not train on
  it (the others' entries of `diffs` are NaN). A voter cannot then have memorised a pair's
  (possibly wrong) label, at the price of training on (F-1)/F of the pairs.

Two modes:
- faithful (the paper): M full reward models, trained one after the other (one in memory at a time);
- fast: one shared trunk with M heads (and M log-likelihood weights), one forward pass per batch
  (batched as voting.train says: random or length-grouped, the prompt shared or not);
  head m sees every pair with a Poisson(1) bootstrap weight of its own (seeded), which stands in
  for its own data order. Cost about one reward-model training; in_sample only (the shared trunk
  trains on every pair).

Buckets use z = mean / scale, with scale = the std of the pairs' means, so the band does not
depend on the voters' units: "incorrect" if mean < 0 (one_sided, the paper) or z <= -band
(symmetric); "ambiguous" if 0 <= z < band (one_sided) or |z| < band (symmetric); else "normal".
"""

from __future__ import annotations

import json
import tempfile
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

import torch
from torch import nn

from rlhf_core import models
from rlhf_core.artifacts import atomic_write, atomic_write_text
from rlhf_core.config import VotingConfig
from rlhf_core.progress import progress_bar
from rlhf_core.reward.losses import bradley_terry_terms, smooth_labels
from rlhf_core.reward.model import RewardModel
from rlhf_core.reward.train import (_optional_column, encode_pairs, epoch_batches, pair_reward_diffs, training_batch,
                                     train_reward_model)
from rlhf_core.schemas import validate_table

BUCKETS = ("incorrect", "ambiguous", "normal")


def strength_stats(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population, ddof=0) std over models of the per-model reward differences.

    diffs: (N, M) with diffs[i, m] = r_m(chosen_i) - r_m(rejected_i); NaN entries (a voter that
    trained on the pair, out_of_fold) are left out. Returns mean (N,), std (N,).
    """
    diffs = np.asarray(diffs, dtype=np.float64)
    if diffs.ndim != 2:
        raise ValueError(f"diffs must be (N, M), got shape {diffs.shape}")
    if np.isnan(diffs).all(axis=1).any():
        raise ValueError("a pair has no vote at all (every entry of its row is NaN)")
    return np.nanmean(diffs, axis=1), np.nanstd(diffs, axis=1)


def strength_scale(mean: np.ndarray) -> float:
    """The unit of preference strength: the std of the pairs' mean strengths (1.0 if it is 0 or undefined)."""
    mean = np.asarray(mean, dtype=np.float64)
    scale = float(mean.std()) if len(mean) > 1 else 0.0
    return scale if scale > 0 and np.isfinite(scale) else 1.0


def bucket(mean: np.ndarray, band: float, scale: float = 1.0, symmetric: bool = False) -> list[str]:
    """Bucket of each pair from its mean strength (N,); `band` is in units of `scale` (see module doc)."""
    z = np.asarray(mean, dtype=np.float64) / scale
    if symmetric:
        # v < 0 as well: with band 0 a pair of mean exactly 0 (two equal texts) is not flipped, as Part II's mean < 0
        return ["incorrect" if v <= -band and v < 0 else "ambiguous" if v < band else "normal" for v in z]
    return ["incorrect" if v < 0 else "ambiguous" if v < band else "normal" for v in z]


def sign_agreement(diffs: np.ndarray) -> float:
    """Mean over model pairs (m, l), m < l, of the share of pairs on which sign(d_m) == sign(d_l).

    diffs: (N, M); only pairs both models voted on (no NaN) count for (m, l).
    """
    diffs = np.asarray(diffs, dtype=np.float64)
    M = diffs.shape[1]
    if M < 2:
        return 1.0
    shares = []
    for m, l in combinations(range(M), 2):
        both = ~np.isnan(diffs[:, m]) & ~np.isnan(diffs[:, l])
        if both.any():
            shares.append(((diffs[both, m] > 0) == (diffs[both, l] > 0)).mean())
    return float(np.mean(shares)) if shares else float("nan")


def model_seed(seed: int, k: int) -> int:
    """Seed of the k-th voter: distinct across k and across round seeds."""
    return seed * 1000 + k


def fold_of_pairs(pair_ids, folds: int, seed: int) -> np.ndarray:
    """(N,) fold index in 0..folds-1 of each pair: a seeded permutation dealt round-robin (balanced folds)."""
    n = len(pair_ids)
    order = np.random.default_rng(seed).permutation(n)
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) % folds
    return out


def voter_path(voter_dir: str | Path, k: int) -> Path:
    """Where voter k's (N,) differences are kept (NaN where it did not vote): voter-KKK.npy."""
    return Path(voter_dir) / f"voter-{k:03d}.npy"


def run_voters(init_dir: str | Path, pairs: pd.DataFrame, cfg: VotingConfig, seed: int, voter_dir: str | Path,
               rank: int = 0, world_size: int = 1, progress: bool = False, device: torch.device | None = None
               ) -> list[int]:
    """Train and score the faithful voters of this rank (k = rank, rank + world_size, ...) into `voter_dir`.

    Voter k's differences and last-epoch training accuracy go to voter-KKK.npy / .json, written
    atomically; a voter whose file exists is skipped, so a killed vote resumes where it stopped,
    and any number of ranks give the same files. Each voter trains on `device` (a worker rank's GPU; None:
    `models.default_device()`). Returns the voters trained here.
    """
    if cfg.mode != "faithful":
        raise ValueError("run_voters trains faithful voters; fast mode is shared_trunk_diffs")
    out_of_fold = cfg.scheme == "out_of_fold"
    if out_of_fold and cfg.n_models < cfg.folds:
        raise ValueError(f"voting.scheme out_of_fold needs n_models ({cfg.n_models}) >= folds ({cfg.folds}): "
                         "every fold must be left out by at least one voter")
    fold = fold_of_pairs(pairs["pair_id"], cfg.folds, seed) if out_of_fold else np.full(len(pairs), -1)
    mine = [k for k in range(rank, cfg.n_models, world_size) if not voter_path(voter_dir, k).exists()]
    for k in progress_bar(mine, desc="vote" if world_size == 1 else f"vote rank {rank}", unit="model",
                          disable=not progress):
        held_out = fold == (k % cfg.folds) if out_of_fold else np.ones(len(pairs), dtype=bool)  # (N,) scored by k
        train_pairs = pairs[~held_out] if out_of_fold else pairs
        model, tokenizer, metrics = train_reward_model(init_dir, train_pairs, cfg.train, model_seed(seed, k),
                                                       device=device, section="voting.train")
        column = np.full(len(pairs), np.nan)  # (N,)
        column[held_out] = pair_reward_diffs(model, tokenizer, pairs[held_out], cfg.train.max_length)
        # NaN stands for "did not vote": a diverged voter's must not pass for it (nor be kept for a resume)
        check_finite_votes(column[held_out], f"voter {k}")
        path = voter_path(voter_dir, k)
        # the .json first: a voter counts as done once its .npy exists
        atomic_write_text(path.with_suffix(".json"), json.dumps({"train_accuracy": metrics["accuracy"]}))
        atomic_write(path, lambda f: np.save(f, column))
        del model
    return mine


def collect_voters(voter_dir: str | Path, n_pairs: int, n_models: int) -> tuple[np.ndarray, list[float]]:
    """(N, M) differences and the M training accuracies from voter_dir; raises naming missing voters."""
    missing = [k for k in range(n_models) if not voter_path(voter_dir, k).exists()]
    if missing:
        raise FileNotFoundError(f"voters {missing} have no result in {voter_dir}: the vote did not finish")
    columns = [np.load(voter_path(voter_dir, k)) for k in range(n_models)]
    if any(c.shape != (n_pairs,) for c in columns):
        raise ValueError(f"voter results in {voter_dir} are not for these {n_pairs} pairs; remove the directory")
    accuracy = [json.loads(voter_path(voter_dir, k).with_suffix(".json").read_text())["train_accuracy"]
                for k in range(n_models)]
    return np.stack(columns, axis=1), accuracy


def vote(
    init_dir: str | Path,
    pairs: pd.DataFrame,
    cfg: VotingConfig,
    seed: int,
    progress: bool = False,
    voter_dir: str | Path | None = None,
    device: torch.device | None = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Train cfg.n_models reward models and measure every pair's preference strength.

    pairs: the comparisons table (pair_id, prompt, chosen, rejected, ...). Faithful mode: voter k is
    trained with cfg.train and seed `model_seed(seed, k)` (out_of_fold: on the pairs outside fold
    k mod folds), scores the pairs it did not train on (in_sample: every pair), and is dropped, so
    one model is in memory at a time. `voter_dir` keeps each finished voter (see `run_voters`):
    pass the same directory to resume, or the directory that worker ranks filled to only collect. The
    models train on `device` (None: `models.default_device()`, the GPU when one is present).

    Returns the votes table (pair_id, mean, std, diffs: list of M floats, NaN where a voter did
    not vote; z = mean / scale; n_votes; bucket) in the order of `pairs`, and metrics:
    share_incorrect / share_ambiguous / share_normal, strength_scale, mean_std, sign_agreement,
    train_accuracy (mean over models), share_at_max_length (pairs with a row cut to cfg.train.max_length, as the
    reward stage reports it: voters that never saw the prompt's start), seconds, seconds_per_model.
    """
    if pairs["pair_id"].duplicated().any():
        raise ValueError("pair_id must be unique in the pairs to vote on")
    if len(pairs) == 0:
        raise ValueError("no pairs to vote on: the comparisons table is empty")
    t0 = time.perf_counter()
    if cfg.mode == "fast":
        if cfg.scheme != "in_sample":
            raise ValueError("voting.mode fast shares one trunk trained on every pair: use voting.scheme in_sample")
        diffs, train_acc = shared_trunk_diffs(init_dir, pairs, cfg, seed, progress, device)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(voter_dir) if voter_dir is not None else Path(tmp)
            run_voters(init_dir, pairs, cfg, seed, directory, progress=progress, device=device)
            diffs, train_acc = collect_voters(directory, len(pairs), cfg.n_models)
    metrics = _vote_metrics(diffs, cfg, train_acc, time.perf_counter() - t0)
    lengths = encode_pairs(models.load_tokenizer(init_dir), pairs, cfg.train.max_length).lengths()
    metrics["share_at_max_length"] = float((lengths >= cfg.train.max_length).mean())
    return votes_table(pairs, diffs, cfg), metrics


def votes_table(pairs: pd.DataFrame, diffs: np.ndarray, cfg: VotingConfig) -> pd.DataFrame:
    """The votes table of (N, M) per-model differences: mean, std, z, n_votes, bucket."""
    mean, std = strength_stats(diffs)
    scale = strength_scale(mean)
    buckets = bucket(mean, cfg.ambiguous_band, scale, symmetric=cfg.band == "symmetric")
    votes = pd.DataFrame(
        {
            "pair_id": pairs["pair_id"].astype(str).tolist(),
            "mean": mean,
            "std": std,
            "diffs": [row.tolist() for row in diffs],
            "z": mean / scale,
            "n_votes": (~np.isnan(diffs)).sum(axis=1),
            "bucket": buckets,
        }
    )
    validate_table("votes", votes)
    return votes


def _vote_metrics(diffs: np.ndarray, cfg: VotingConfig, train_acc: list[float], seconds: float) -> dict[str, float]:
    mean, std = strength_stats(diffs)
    scale = strength_scale(mean)
    buckets = bucket(mean, cfg.ambiguous_band, scale, symmetric=cfg.band == "symmetric")
    metrics = {f"share_{b}": buckets.count(b) / max(len(buckets), 1) for b in BUCKETS}
    metrics.update(
        strength_scale=scale,
        mean_std=float(std.mean()) if len(std) else 0.0,
        sign_agreement=sign_agreement(diffs),
        train_accuracy=float(np.mean(train_acc)),
        seconds=seconds,
        seconds_per_model=seconds / cfg.n_models,
    )
    return metrics


def bootstrap_weights(rng: np.random.Generator, n_pairs: int, n_heads: int) -> torch.Tensor:
    """(n_pairs, n_heads) Poisson(1) counts: head m trains on each pair as often as a bootstrap sample would hold
    it (the online bootstrap), so the heads see different data as faithful voters' data orders differ."""
    return torch.tensor(rng.poisson(1.0, size=(n_pairs, n_heads)), dtype=torch.float32)


class SharedTrunkVoters(nn.Module):
    """M heads and M log-likelihood weights (and, with the weighted read, M per-token weights) over one
    reward-model trunk (voting's fast mode)."""

    def __init__(self, base: RewardModel, n_heads: int):
        super().__init__()
        self.base = base
        hidden = base.config.hidden_size
        self.heads = nn.ModuleList(nn.Linear(hidden, 1, bias=False) for _ in range(n_heads))
        for head in self.heads:
            nn.init.normal_(head.weight, std=1.0 / (hidden + 1) ** 0.5)
        self.logprob_weights = nn.Parameter(torch.ones(n_heads), requires_grad=base.read != "end_token")
        self.token_weights = None  # the weighted read's u_m . h + b_m per head, zero at the start
        if base.token_weight is not None:
            self.token_weights = nn.Linear(hidden, n_heads)
            nn.init.zeros_(self.token_weights.weight)
            nn.init.zeros_(self.token_weights.bias)

    def forward(self, batch: dict) -> torch.Tensor:
        """(N, M) rewards of every head from one pass of the trunk over a `pair_batch`, or (2B, M) over a
        `shared_prompt_batch` (each prompt run once for both replies)."""
        if "continuations" in batch:
            return self.base.shared_prompt_rewards(batch["prompt_ids"], batch["prompt_mask"], batch["continuations"],
                                                   batch["prompt_groups"], read=self.read)
        hidden = self.base.hidden_states(batch["input_ids"], batch["attention_mask"])  # (N, T, H)
        return self.base.rewards_from_hidden(hidden, batch, read=self.read)

    def read(self, end: torch.Tensor, predictor: torch.Tensor, targets: torch.Tensor, predicts: torch.Tensor
             ) -> torch.Tensor:
        """(N, M) `RewardModel.read_rewards` with each head's own head, log-likelihood weight and token weights;
        the log-likelihood is computed once for all heads."""
        rewards = torch.cat([head(end) for head in self.heads], dim=1)  # (N, M)
        if self.base.read == "end_token":
            return rewards
        token_logp = self.base.token_logprob(predictor, targets, predicts)  # (N, T')
        if self.token_weights is None:
            return rewards + self.logprob_weights[None, :] * token_logp.sum(dim=1)[:, None]
        per_token = self.logprob_weights[None, None, :] + self.token_weights(predictor)  # (N, T', M)
        return rewards + (per_token * token_logp[..., None]).sum(dim=1)


def shared_trunk_diffs(init_dir, pairs: pd.DataFrame, cfg: VotingConfig, seed: int, progress: bool = False,
                       device: torch.device | None = None) -> tuple[np.ndarray, list[float]]:
    """Fast mode: train SharedTrunkVoters on `pairs` (each head with its own Poisson(1) pair weights); returns
    (N, M) diffs and each head's last-epoch training accuracy.

    The pairs are tokenised once; cfg.train's batching, share_prompt, margin / soft_label columns and label
    smoothing apply as in `train_reward_model` (its lm_coef and contrastive loss are refused by VotingConfig).
    Trains on `device` (None: `models.default_device()`)."""
    tcfg = cfg.train
    device = device or models.default_device()
    voters = SharedTrunkVoters(RewardModel.from_policy(init_dir, seed, tcfg.read), cfg.n_models).to(device)
    tokenizer = models.load_tokenizer(init_dir)
    rng = np.random.default_rng(seed)
    weights = bootstrap_weights(rng, len(pairs), cfg.n_models).to(device)  # (N, M)
    head_params = list(voters.heads.parameters()) + ([voters.logprob_weights] if voters.logprob_weights.requires_grad
                                                     else [])
    if voters.token_weights is not None:
        head_params += list(voters.token_weights.parameters())
    trunk_params = [p for p in voters.base.classifier.base_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": trunk_params, "lr": tcfg.lr},
                                   {"params": head_params, "lr": tcfg.head_lr or tcfg.lr}],
                                  weight_decay=tcfg.weight_decay)
    total = tcfg.epochs * -(-len(pairs) // tcfg.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / total)
    encoded = encode_pairs(tokenizer, pairs, tcfg.max_length)  # once: every batch is padded from it
    lengths = encoded.batching_lengths(tcfg.share_prompt)
    voters.train()
    bar = progress_bar(total=total, desc="vote (shared trunk)", disable=not progress, leave=False)
    for _ in range(tcfg.epochs):
        correct = np.zeros(cfg.n_models)  # this epoch's pairs ranked right, per head
        for rows in epoch_batches(len(pairs), tcfg, rng, lengths):  # tcfg.batching, as a faithful voter's
            batch_pairs = pairs.iloc[rows]
            B = len(rows)
            rewards = voters(training_batch(encoded, rows, tcfg, device))  # (2B, M)
            gap = rewards[:B] - rewards[B:]  # (B, M)
            margin = _optional_column(batch_pairs, "margin", device)
            soft = _optional_column(batch_pairs, "soft_label", device)
            d = gap - (margin[:, None] if margin is not None else 0.0)
            p = soft if soft is not None else torch.ones(B, device=device)  # (B,)
            if tcfg.label_smoothing:
                p = smooth_labels(p, tcfg.label_smoothing)
            per_pair = bradley_terry_terms(d, p[:, None].expand_as(d))  # (B, M) Bradley-Terry per head
            w = weights[rows]  # (B, M)
            loss = (w * per_pair).sum() / w.sum().clamp(min=1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(voters.parameters(), tcfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            correct += (gap.detach() > 0).float().sum(0).cpu().numpy()
            bar.update(1)
    bar.close()
    voters.eval()
    diffs = []
    with torch.no_grad():
        for start in range(0, len(pairs), 64):
            rows = np.arange(start, min(start + 64, len(pairs)))
            rewards = voters(training_batch(encoded, rows, tcfg, device))
            diffs.append((rewards[: len(rows)] - rewards[len(rows):]).double().cpu().numpy())
    diffs = np.concatenate(diffs)
    check_finite_votes(diffs, "the shared-trunk voters")
    return diffs, (correct / len(pairs)).tolist()


def check_finite_votes(diffs: np.ndarray, who: str) -> None:
    """Raise, saying what to change, when a voter's reward differences are not all finite (it diverged)."""
    bad = int((~np.isfinite(diffs)).sum())
    if bad:
        raise FloatingPointError(f"{who} gave {bad} non-finite reward differences of {diffs.size}: its training "
                                 "diverged; lower voting.train.lr (or head_lr) or voting.train.max_grad_norm")
