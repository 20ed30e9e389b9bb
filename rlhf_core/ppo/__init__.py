"""PPO-max: pure losses, advantages and running statistics (core), and the training loop (trainer)."""
