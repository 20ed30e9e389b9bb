"""Process entry points launched by tasks (`python -m rlhf_core.workers.<name>`, or under accelerate / torchrun).

Each worker parses its arguments, does one job through rlhf_core, and writes its outputs to disk; no Prefect,
no MLflow. Importing this package imports nothing heavy.
"""
