"""Voting as worker ranks: voter k on rank k mod N, every finished voter kept, same votes for 1 or N ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core import models
from rlhf_core.config import RewardTrainConfig, VotingConfig
from rlhf_core.reward.voting import collect_voters, run_voters, vote, voter_path
from tasks.launch import run_worker
from test_reward import TINY, make_pairs

CFG = VotingConfig(n_models=3, train=RewardTrainConfig(read="end_token", epochs=1, batch_size=16, lr=3e-3,
                                                       max_length=64))


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = models.build_tokenizer()
    out = tmp_path_factory.mktemp("policy")
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, out)
    yield out
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pairs():
    return make_pairs(40, seed=7)


@pytest.fixture(scope="module")
def one_process(init_dir, pairs):
    return vote(init_dir, pairs, CFG, seed=3)[0]


def test_ranks_share_the_voters_and_a_stopped_vote_resumes(init_dir, pairs, one_process, tmp_path):
    assert run_voters(init_dir, pairs, CFG, 3, tmp_path, rank=1, world_size=2) == [1]  # rank 1 of 2: voter 1
    assert sorted(p.name for p in tmp_path.glob("voter-*.npy")) == ["voter-001.npy"]
    # a later single-rank run (the resume) trains only what is missing, and the result is the uninterrupted one
    assert run_voters(init_dir, pairs, CFG, 3, tmp_path) == [0, 2]
    assert run_voters(init_dir, pairs, CFG, 3, tmp_path) == []
    votes, _ = vote(init_dir, pairs, CFG, seed=3, voter_dir=tmp_path)
    pd.testing.assert_frame_equal(votes, one_process, atol=1e-5, rtol=1e-5)


def test_collect_names_the_missing_voters(init_dir, pairs, tmp_path):
    run_voters(init_dir, pairs, CFG, 3, tmp_path, rank=0, world_size=3)
    with pytest.raises(FileNotFoundError, match=r"voters \[1, 2\]"):
        collect_voters(tmp_path, len(pairs), 3)
    np.save(voter_path(tmp_path, 1), np.zeros(5))
    (tmp_path / "voter-001.json").write_text('{"train_accuracy": 0.5}')
    np.save(voter_path(tmp_path, 2), np.zeros(len(pairs)))
    (tmp_path / "voter-002.json").write_text('{"train_accuracy": 0.5}')
    with pytest.raises(ValueError, match="not for these 40 pairs"):
        collect_voters(tmp_path, len(pairs), 3)


def test_two_worker_ranks_under_accelerate_give_the_one_process_votes(init_dir, pairs, one_process, tmp_path,
                                                                      monkeypatch):
    pairs.to_parquet(tmp_path / "pairs.parquet", index=False)
    (tmp_path / "voting.json").write_text(CFG.model_dump_json())
    voter_dir = tmp_path / "voters"
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("RLHF_TORCH_THREADS", "1")
    run_worker("rlhf_core.workers.vote", ["--init-dir", str(init_dir), "--pairs", str(tmp_path / "pairs.parquet"),
                                          "--config", str(tmp_path / "voting.json"), "--seed", "3",
                                          "--voter-dir", str(voter_dir)], 2, tmp_path / "worker.log")
    assert (voter_dir / "world_size.txt").read_text().strip() == "2"  # two ranks, not two lone processes
    log = (tmp_path / "worker.log").read_text()
    assert "rank 0/2 trained voters [0, 2]" in log and "rank 1/2 trained voters [1]" in log
    votes, _ = vote(init_dir, pairs, CFG, seed=3, voter_dir=voter_dir)
    pd.testing.assert_frame_equal(votes, one_process, atol=1e-5, rtol=1e-5)


def test_fast_mode_is_one_process():
    with pytest.raises(ValueError, match="num_processes 1"):
        VotingConfig(mode="fast", num_processes=2)


def test_voters_train_on_the_device_they_are_given_and_the_worker_gives_its_own(init_dir, pairs, tmp_path,
                                                                                  monkeypatch):
    """The device reaches every voter's training: from `vote`, and from the worker (its accelerator's device).
    Until 2026-11-28 the vote worker passed none, so GPU ranks trained their voters on the CPU."""
    import rlhf_core.reward.voting as voting
    import rlhf_core.workers.vote as vote_worker

    real_train, devices = voting.train_reward_model, []

    def recording_train(*args, device=None, **kwargs):
        devices.append(device)
        return real_train(*args, device=device, **kwargs)

    monkeypatch.setattr(voting, "train_reward_model", recording_train)
    cfg = CFG.model_copy(update={"n_models": 2})
    vote(init_dir, pairs, cfg, seed=3, device=torch.device("cpu"))
    assert devices == [torch.device("cpu")] * 2

    # the worker, with a stand-in accelerator whose device ("cpu:0") is not what any default would give
    devices.clear()
    accelerator = SimpleNamespace(device=torch.device("cpu", 0), process_index=0, num_processes=1,
                                  is_main_process=True)
    monkeypatch.setattr(vote_worker, "start_ranks", lambda: accelerator)
    monkeypatch.setattr(vote_worker, "finish_ranks", lambda accelerator, out_dir: None)
    (tmp_path / "voting.json").write_text(cfg.model_dump_json())
    pairs.to_parquet(tmp_path / "pairs.parquet", index=False)
    vote_worker.main(["--init-dir", str(init_dir), "--pairs", str(tmp_path / "pairs.parquet"), "--config",
                      str(tmp_path / "voting.json"), "--seed", "3", "--voter-dir", str(tmp_path / "voters")])
    assert devices == [torch.device("cpu", 0)] * 2
