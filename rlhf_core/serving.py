"""The registered models as MLflow pyfunc models: a reward model scores, a policy answers.

Each model a stage registers (rlhf-sft-policy, rlhf-policy, rlhf-reward-model) is logged with an MLmodel file whose
pyfunc flavour names this module as its loader, so the usual MLflow tools work on it:

    model = mlflow.pyfunc.load_model("models:/rlhf-reward-model@candidate")
    model.predict(pd.DataFrame({"prompt": ["What is 2+3?"], "response": [" It is 5."]}))   # a `reward` column

    mlflow models serve -m models:/rlhf-policy@champion --env-manager local -p 5001

MLflow calls `_load_pyfunc(data_path, model_config)` with the model's folder (the stage's Hugging Face directory) and
the defaults written at registration (`kind`, and `max_length` or `max_new_tokens`). The reward is the one the
pipeline trains and PPO optimises, read as the stage reads it (`RewardModel.load`: end token, log-likelihood or both),
before PPO's running normalisation. A policy answers greedily unless `temperature` says otherwise, conditioned as in
training (`format_query`: the tokenizer's chat template, else the world's "Q: ...\\nA:").

This module imports neither MLflow nor Prefect (the layer rule): MLflow only reads its name from the MLmodel file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

REWARD_MODEL, POLICY = "reward_model", "policy"  # the artifact kinds a registered model can be
REWARD_DEFAULTS = {"max_length": 96, "batch_size": 64}
POLICY_DEFAULTS = {"max_new_tokens": 24, "temperature": 0.0, "top_p": 1.0, "seed": 0, "batch_size": 32}


def settings_defaults(kind: str, model_config: dict[str, Any]) -> dict[str, Any]:
    """A model's parameter defaults: its kind's, with those the registration wrote (`model_config`) over them."""
    base = REWARD_DEFAULTS if kind == REWARD_MODEL else POLICY_DEFAULTS
    return base | {k: v for k, v in model_config.items() if k in base}


def _rows(model_input: Any, columns: tuple[str, ...]) -> pd.DataFrame:
    """The request as a table with `columns`: a DataFrame, a dict of lists, or a list of dicts (a bare list of
    strings for a one-column request)."""
    if isinstance(model_input, pd.DataFrame):
        frame = model_input
    elif isinstance(model_input, list) and model_input and all(isinstance(x, str) for x in model_input) \
            and len(columns) == 1:
        frame = pd.DataFrame({columns[0]: model_input})
    else:
        frame = pd.DataFrame(model_input)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"the request has no column {', '.join(map(repr, missing))}: send a table with the columns "
                         f"{', '.join(columns)} (it has {', '.join(map(str, frame.columns)) or 'none'})")
    bad = [c for c in columns if not frame[c].map(lambda v: isinstance(v, str)).all()]
    if bad:
        raise ValueError(f"column {bad[0]!r} must hold text in every row")
    return frame


def _settings(defaults: dict[str, Any], params: dict[str, Any] | None) -> dict[str, Any]:
    """The request's parameters over the defaults, checked. (Served through MLflow, the signature has already
    dropped an unknown name with a warning and filled in every default.)"""
    unknown = sorted(set(params or {}) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameter {', '.join(unknown)}: this model takes {', '.join(sorted(defaults))}")
    settings = {k: type(v)(params[k]) if params and k in params else v for k, v in defaults.items()}
    low = {"max_length": 8, "batch_size": 1, "max_new_tokens": 1, "seed": 0, "temperature": 0.0}
    bad = [f"{k} {settings[k]} (at least {low[k]})" for k in settings if k in low and settings[k] < low[k]]
    if "top_p" in settings and not 0 < settings["top_p"] <= 1:
        bad.append(f"top_p {settings['top_p']} (in (0, 1])")
    if bad:
        raise ValueError(f"parameter out of range: {'; '.join(bad)}")
    return settings


class RewardScorer:
    """predict(table of prompt, response) -> table of `reward`, one per row."""

    def __init__(self, path: str | Path, defaults: dict[str, Any]):
        from rlhf_core.models import load_tokenizer
        from rlhf_core.reward.model import RewardModel

        self.model, self.tokenizer = RewardModel.load(path), load_tokenizer(path)
        self.defaults = settings_defaults(REWARD_MODEL, defaults)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from rlhf_core.reward.model import score_texts

        rows, s = _rows(model_input, ("prompt", "response")), _settings(self.defaults, params)
        rewards = score_texts(self.model, self.tokenizer, rows["prompt"].tolist(), rows["response"].tolist(),
                              max_length=s["max_length"], batch_size=s["batch_size"])
        return pd.DataFrame({"reward": rewards.double().numpy()}, index=rows.index)


class PolicyResponder:
    """predict(table of prompt) -> table of `response`, one per row."""

    def __init__(self, path: str | Path, defaults: dict[str, Any]):
        from rlhf_core.models import load_policy, load_tokenizer

        self.model, self.tokenizer = load_policy(path).eval(), load_tokenizer(path)
        self.defaults = settings_defaults(POLICY, defaults)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from rlhf_core.generation.sampler import sample_batch
        from rlhf_core.models import format_query

        rows, s = _rows(model_input, ("prompt",)), _settings(self.defaults, params)
        queries = [format_query(self.tokenizer, p) for p in rows["prompt"]]
        responses: list[str] = []
        for i in range(0, len(queries), s["batch_size"]):
            batch = queries[i:i + s["batch_size"]]
            # sampled: row j draws from its own stream (seed, j), so its response depends on neither the batch size
            # nor the other prompts of the request (as PPO's ranks draw)
            # (mod 2**63: torch seeds a generator with a signed 64-bit integer; the signature takes any long)
            row_seeds = ([(s["seed"] * 1_000_003 + i + j) % 2**63 for j in range(len(batch))]
                         if s["temperature"] > 0 else None)
            rollout = sample_batch(self.model, self.tokenizer, batch, s["max_new_tokens"], temperature=s["temperature"],
                                   top_p=s["top_p"], row_seeds=row_seeds)
            responses += rollout.texts
        return pd.DataFrame({"response": responses}, index=rows.index)


def load(path: str | Path, kind: str, defaults: dict[str, Any] | None = None) -> RewardScorer | PolicyResponder:
    """The model in `path` (a stage's output folder) as a scorer or a responder."""
    if kind == REWARD_MODEL:
        return RewardScorer(path, defaults or {})
    if kind == POLICY:
        return PolicyResponder(path, defaults or {})
    raise ValueError(f"no pyfunc for a model of kind {kind!r}: {REWARD_MODEL} or {POLICY}")


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> RewardScorer | PolicyResponder:
    """MLflow's entry point (the MLmodel's pyfunc `loader_module`)."""
    config = dict(model_config or {})
    return load(data_path, config.pop("kind", ""), config)
