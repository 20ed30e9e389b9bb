"""What PPO trains a model with: the model, AdamW and the learning-rate schedule, and one optimiser step.

Two learners with one interface, chosen once by `train_ppo`: `Learner` (plain PyTorch; gradients summed
over the data-parallel ranks by hand) and `DeepSpeedLearner` (a DeepSpeed engine, ZeRO stage 1 or 2:
optimiser state and gradients partitioned over the ranks; stage 3: the weights too; Rajbhandari et al.
2020), one engine per trained model as OpenRLHF's actor and critic have. Both take the same loss, this
rank's share of a minibatch's loss, and make the same step: the global minibatch's gradient, its global
norm clipped to max_grad_norm, AdamW, then the project's schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import copy

import torch
from torch import nn

from rlhf_core.ppo.core import lr_factor
from rlhf_core.ppo.data_parallel import Ranks


@dataclass
class Learner:
    """A model with its optimiser and learning-rate schedule; `step` is one optimiser step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    zero_ranks = None  # a checkpoint holds the whole state (see DeepSpeedLearner.zero_ranks)

    @classmethod
    def build(cls, model: nn.Module, lr: float, schedule: str, warmup_steps: int, total_steps: int) -> Learner:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        factor = lambda step: lr_factor(step, schedule, warmup_steps, total_steps)  # noqa: E731
        return cls(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor))

    def step(self, loss: torch.Tensor, max_grad_norm: float, ranks: Ranks = Ranks()) -> None:
        """loss: this rank's part of the global minibatch's loss (the ranks' parts sum to it)."""
        self.optimizer.zero_grad()
        loss.backward()
        ranks.sum_gradients(self.model)  # the global minibatch's gradient, on every rank
        nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm)  # global norm over all parameters
        self.optimizer.step()
        self.schedule.step()

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def full_model(self) -> nn.Module:
        """The model with all its weights on this rank (what generation and saving read)."""
        return self.model

    def save(self, directory: Path, name: str) -> dict:
        """The state a checkpoint keeps for this model: all of it, in the checkpoint file itself."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict()}

    def restore(self, directory: Path, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])


def engine_config(config: dict[str, Any], max_grad_norm: float) -> dict[str, Any]:
    """A DeepSpeed JSON config made fit for PPO's loop: one backward and one step per minibatch (micro batch 1,
    no accumulation: the loop feeds its own minibatches), clipping at max_grad_norm, our AdamW as the client
    optimizer."""
    if "optimizer" in config or "scheduler" in config:
        raise ValueError("ppo.deepspeed: the config names an optimizer or scheduler; PPO brings its own AdamW and "
                         "learning-rate schedule (ppo.policy_lr, ppo.critic_lr, ppo.lr_schedule): remove them")
    fitted = {k: v for k, v in config.items() if k != "train_batch_size"}
    return fitted | {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                     "gradient_clipping": max_grad_norm, "zero_allow_untested_optimizer": True}


@dataclass
class DeepSpeedLearner:
    """A Learner whose model trains through a DeepSpeed engine (see the module's docstring).

    `model` is the engine's module, so forwards are those of the plain learner; the engine takes the
    backward (reducing the gradients over the ranks), the clipping and AdamW's step. The schedule stays
    ours, on the client optimizer's parameter groups (which the engine's optimizer steps with).

    ZeRO-3 partitions the weights: every forward of the module gathers them, a collective, so the ranks
    must run the same forwards (the trainer sees to it), and generation, whose number of decoding steps
    differs between ranks, cannot run on the module. A model that generates (the policy) therefore keeps
    a plain `twin` that `full_model` gathers the current weights into.
    """

    engine: Any  # deepspeed.DeepSpeedEngine
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    twin: nn.Module | None = None

    @classmethod
    def build(cls, model: nn.Module, lr: float, schedule: str, warmup_steps: int, total_steps: int,
              config: dict[str, Any]) -> DeepSpeedLearner:
        """config: `engine_config`'s, the same on every rank."""
        import deepspeed  # heavy: only where DeepSpeed is asked for

        scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
        if scalars:  # DeepSpeed 0.19.8 broadcasts every parameter viewed as bytes, which a 0-dim one cannot be
            raise ValueError(f"DeepSpeed cannot train 0-dim parameters ({', '.join(scalars)}): run PPO without "
                             "ppo.deepspeed, or give them shape (1,)")
        partitioned = config.get("zero_optimization", {}).get("stage") == 3 and hasattr(model, "generate")
        twin = copy.deepcopy(model).requires_grad_(False) if partitioned else None
        plain = Learner.build(model, lr, schedule, warmup_steps, total_steps)
        engine, *_ = deepspeed.initialize(model=model, optimizer=plain.optimizer, config=config)
        return cls(engine, plain.optimizer, plain.schedule, twin)

    @property
    def model(self) -> nn.Module:
        return self.engine.module

    def step(self, loss: torch.Tensor, max_grad_norm: float, ranks: Ranks = Ranks()) -> None:
        """As `Learner.step`; max_grad_norm is the engine's gradient_clipping (set by `engine_config`).

        The engine averages the gradients over the ranks where the project sums the ranks' shares of the
        minibatch's loss: the loss is scaled by the world size so that the average is that sum."""
        self.engine.backward(loss * ranks.world_size)
        self.engine.step()  # clip, AdamW, zero the gradients
        self.schedule.step()

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def full_model(self) -> nn.Module:
        """The model with all its weights on this rank: the engine's module, or under ZeRO-3 the twin with the
        current weights gathered into it (a collective: every rank calls it)."""
        if self.twin is None:
            return self.model
        import deepspeed

        params = list(self.model.parameters())
        with deepspeed.zero.GatheredParameters(params), torch.no_grad():
            for gathered, twin in zip(params, self.twin.parameters()):
                twin.copy_(gathered)
        return self.twin

    @property
    def zero_ranks(self) -> int:
        """The ranks the optimiser state is partitioned over: a checkpoint resumes on as many."""
        return self.engine.dp_world_size

    def save(self, directory: Path, name: str) -> dict:
        """Every rank writes its partition with the engine's own save_checkpoint, to directory/name; the
        checkpoint file keeps the schedule and where the rest is."""
        self.engine.save_checkpoint(str(directory), tag=name, save_latest=False)  # ends with a barrier
        return {"deepspeed": name, "schedule": self.schedule.state_dict()}

    def restore(self, directory: Path, state: dict) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag=state["deepspeed"],
                                              load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {state['deepspeed']!r} under {directory}")
        self.schedule.load_state_dict(state["schedule"])
