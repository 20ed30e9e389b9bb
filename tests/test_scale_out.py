"""The scale-out model (benchmarks/scale_out.py): its formulas on hand-computed cases, and its outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_out as so  # noqa: E402

N_7B = 6.74e9  # Llama-2-7B: 32 layers, hidden 4096, 32 KV heads of 128, vocabulary 32000


def test_a_7b_zero3_sft_on_8_gpus_takes_the_hand_computed_memory_and_time():
    s, w = so.Setup(so.LLAMA2_7B, so.A100_80GB, 8, 3, so.BF16_MIXED), so.Workload()
    states = (2 + 2 + 12) * N_7B / 8  # bf16 weights, bf16 gradients, fp32 master + 2 moments, all sharded
    tokens = 4 * 512  # a micro-batch of 4 sequences of 256 + 256 tokens
    checkpoints = 32 * tokens * 4096 * 2  # each layer's input, bf16
    recomputed_layer = 17 * tokens * 4096 * 2  # one layer's activations during its recomputation
    logits = tokens * 32000 * 4  # fp32 logits
    row = so.sft_stage(s, w)
    assert row["memory_gb"] == pytest.approx((states + checkpoints + recomputed_layer + logits) / 1e9)
    assert row["memory_gb"] == pytest.approx(14.5642, abs=1e-4) and row["fits"]
    compute = 8 * N_7B * 1024 * 512 / (8 * 312e12 * 0.30)  # 8N per token with checkpointing, at 30 % MFU
    communication = 8 * (1.5 * 2 * 2 * N_7B * 7 / 8) / 240e9  # 8 steps of ZeRO-3's 1.5x all-reduce over NVLink
    assert row["seconds"] == pytest.approx(compute + communication)
    assert row["seconds"] == pytest.approx(37.75 + 1.18, abs=0.01)


def test_zero_stages_shard_what_the_zero_paper_says():
    # fp32 (this project's shipped configs): 4 + 4 + 8 bytes per parameter, no master copy
    assert so.model_states_bytes(N_7B, so.FP32, 0, 8) == 16 * N_7B
    assert so.model_states_bytes(N_7B, so.FP32, 2, 8) == pytest.approx(4 * N_7B + 12 * N_7B / 8)
    assert so.model_states_bytes(N_7B, so.BF16_MIXED, 3, 64) == pytest.approx(16 * N_7B / 64)
    with pytest.raises(ValueError, match="zero_stage 1"):
        so.model_states_bytes(N_7B, so.FP32, 1, 8)


def test_decoding_is_bandwidth_bound_at_a_small_batch():
    gen = so.generation(so.LLAMA2_7B, so.A100_80GB, "vllm", n_sequences=8, prompt_tokens=100, response_tokens=10,
                        n_gpus=1, tensor_parallel=1, weight_bytes_per_param=2, free_bytes_per_gpu=10e9)
    kv_token = 2 * 32 * 32 * 128 * 2  # a key and a value per layer per head, bf16: 0.5 MiB
    assert gen["batch"] == 8 and gen["waves"] == 1 and gen["kv_bytes_per_gpu"] == 8 * 110 * kv_token
    step = (2 * N_7B + 8 * 105 * kv_token) / (2.039e12 * 0.6)  # weights + KV at the mean context, 60 % of HBM
    assert step > 2 * N_7B * 8 / (312e12 * 0.30)  # the compute of the step is smaller: memory-bound
    prefill = 2 * N_7B * 8 * 100 / (312e12 * 0.30)
    assert gen["seconds"] == pytest.approx(prefill + 10 * step)
    assert gen["seconds"] == pytest.approx(0.2290, abs=1e-4)


def test_what_does_not_fit_is_marked():
    w = so.Workload()
    # the project's PPO as shipped: fp32, reference and reward model whole on every rank, ZeRO-3's whole policy copy
    assert not so.ppo_stage(so.Setup(so.LLAMA2_7B, so.A100_80GB, 64, 3, so.FP32), w)["fits"]
    # a 70B policy is 138 GB in bf16: no GPU holds it whole for generation
    assert not so.generation_stage(so.Setup(so.LLAMA2_70B, so.A100_80GB, 64, 3, so.BF16_MIXED), w)["fits"]
    assert so.reward_stage(so.Setup(so.LLAMA2_70B, so.A100_80GB, 32, 3, so.BF16_MIXED), w)["fits"]


def test_a_published_check_reads_the_published_table():
    check = next(c for c in so.published_checks() if c["name"] == "DeepSpeed-Chat OPT-13B on 8 A100-80GB")
    assert check["published_seconds"] == pytest.approx(9 * 3600 / (131_900 / 1024))  # 251.5 s per 1,024 pairs
    assert check["ratio"] == pytest.approx(check["modelled_seconds"] / check["published_seconds"])
    assert check["within_tolerance"] == (abs(check["ratio"] - 1) <= 0.30)


def test_the_script_writes_its_json_and_replaces_its_doc_section(tmp_path):
    out_json, doc = tmp_path / "scale-out.json", tmp_path / "scale-out.md"
    doc.write_text("# Scale-out\n\nwritten by hand, kept\n")
    argv = ["--json", str(out_json), "--doc", str(doc), "--figure", ""]
    so.main(argv)
    first = doc.read_text()
    so.main(argv)  # a second run replaces its section, it does not add one

    text = doc.read_text()
    assert text.count(so.SECTION_START) == 1 and text.count(so.SECTION_END) == 1
    assert text.startswith("# Scale-out\n\nwritten by hand, kept\n") and len(text) == len(first)
    result = json.loads(out_json.read_text())
    sft = next(r for r in result["stages"] if r["policy"] == "7B" and r["precision"] == "bf16"
               and r["zero_stage"] == 3 and r["gpus"] == 8 and r["stage"] == "sft")
    assert sft["memory_gb"] == pytest.approx(14.5642, abs=1e-4)
    assert len(result["stages"]) == 2 * 2 * 2 * 4 * 6  # policies x precisions x ZeRO stages x GPU counts x stages
    assert {c["name"] for c in result["checks"]} >= {"OpenRLHF Llama-2-7B (length caps 1024 + 1024)"}
