"""Response generation: batched sampling with a KV cache, shared by the generation stage and PPO rollouts."""
