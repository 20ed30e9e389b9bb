"""Reward models: a backbone with a scalar head read at the end token.

Modules (import them directly; this package imports nothing heavy):

- `losses`:   `preference_loss` — Bradley-Terry with optional adaptive margin and soft labels.
- `model`:    `encode` (prompt + response + eos, left-truncated) and `score_texts`.
- `train`:    `train_reward_model` on preference pairs, `pairwise_accuracy`.
- `voting`:   preference strength from M reward models (Secrets of RLHF Part II).
- `denoise`:  flip incorrect pairs, smooth ambiguous ones, attach an adaptive margin.
"""
