"""Beyond one machine, on paper: a memory and time model of the pipeline's stages at 7B and 70B (issue 12).

    .venv/bin/python benchmarks/scale_out.py [--json docs/scale-out.json] [--doc docs/scale-out.md]
        [--figure docs/figures/scale-out-ppo.png]

Nothing runs on a GPU: every number comes from the small formulas below, each with its constants named and
sourced. Memory per GPU: weights, gradients and Adam states sharded as ZeRO stage 2 or 3 shards them
(Rajbhandari et al. 2020, sec. 5), activations with and without gradient checkpointing (Korthikanti et al.
2022), the KV cache of generation. Time: 6N FLOPs per trained token (8N with checkpointing's second
forward), 2N per forward-only token (Kaplan et al. 2020), over an assumed model FLOP utilisation; decoding as
memory-bandwidth-bound steps (weights and KV cache read once per token step) unless the batch makes it
compute-bound (a roofline), over an assumed bandwidth utilisation. The model is checked against published
RLHF timings (OpenRLHF vs DeepSpeed-Chat, DeepSpeed-Chat's own table) in the same output.

Writes the JSON (--json), its own section of --doc between markers (the rest of that file stays) and a
figure of PPO's time per 1,024 prompts by phase (--figure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_section import replace_section  # noqa: E402
from rlhf_core.artifacts import atomic_write_text  # noqa: E402

SECTION_START, SECTION_END = "<!-- scale-out:start -->", "<!-- scale-out:end -->"
GiB = 2**30


# ---------------------------------------------------------------- hardware and models


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: float
    peak_flops: float  # dense bf16 tensor-core FLOP/s
    hbm_bytes_per_s: float


# NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e, 80 GiB. The A800 is the A100 with
# NVLink cut to 400 GB/s: the same compute and memory per GPU.
A100_80GB = Gpu("A100/A800 80GB SXM", 80 * GiB, 312e12, 2.039e12)
# NVIDIA H100 SXM datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GiB.
H100_80GB = Gpu("H100 80GB SXM", 80 * GiB, 989e12, 3.35e12)
GPUS = {"a100": A100_80GB, "h100": H100_80GB}

GPUS_PER_NODE = 8  # a DGX / HGX node
# Bandwidth one GPU gets in a ring all-reduce: inside a node NVLink 3 (600 GB/s bidirectional per GPU, DGX A100
# datasheet; about 300 GB/s each way, of which NCCL's bus bandwidth reaches some 80 %), across nodes one 200 Gb/s
# HDR InfiniBand NIC per GPU (DGX A100: 8 x 200 Gb/s compute fabric) = 25 GB/s.
INTRA_NODE_BYTES_PER_S = 240e9
INTER_NODE_BYTES_PER_S = 25e9
USABLE_MEMORY_FRACTION = 0.9  # CUDA context, allocator fragmentation (vLLM's gpu_memory_utilization default 0.9)


@dataclass(frozen=True)
class Transformer:
    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int


# Touvron et al. 2023 (Llama 2), Table 1 and the released configs: 7B is multi-head, 70B grouped-query (8 KV heads).
LLAMA2_7B = Transformer("Llama-2-7B", 6.74e9, 32, 4096, 32, 128, 32000)
LLAMA2_70B = Transformer("Llama-2-70B", 68.98e9, 80, 8192, 8, 128, 32000)
# Zhang et al. 2022 (OPT), Table 1: the models of DeepSpeed-Chat's published table.
OPT_350M = Transformer("OPT-350M", 0.331e9, 24, 1024, 16, 64, 50272)
OPT_6_7B = Transformer("OPT-6.7B", 6.66e9, 32, 4096, 32, 128, 50272)
OPT_13B = Transformer("OPT-13B", 12.85e9, 40, 5120, 40, 128, 50272)
OPT_66B = Transformer("OPT-66B", 65.7e9, 64, 9216, 72, 128, 50272)
POLICIES = {"7B": LLAMA2_7B, "70B": LLAMA2_70B}  # the reward model and critic are taken the same size

# ---------------------------------------------------------------- efficiency assumptions

# Model FLOP utilisation of training and of forward-only scoring: PaLM (Chowdhery et al. 2022), Table 3, lists
# 21.3 % (GPT-3), 32.5 % (Gopher), 30.2 % (Megatron-Turing NLG, A100) and 46.2 % (PaLM) for large-scale training.
TRAIN_MFU = 0.30
FORWARD_MFU = 0.30
# Decoding engines: the share of HBM bandwidth a decode step reaches (model bandwidth utilisation, MBU, as
# Databricks' "LLM Inference Performance Engineering: Best Practices", 2023, defines it) and a fixed cost per
# token step. vLLM (paged KV cache, CUDA graphs): 0.6, no fixed cost (assumption, of the order tuned servers
# report). transformers' eager `generate` (this project's PPO rollouts and generation with num_processes > 1;
# DeepSpeed-Chat's Hybrid Engine is modelled the same): 0.3 and 25 ms per step, about what a 32-layer 7B costs
# in kernel launches at batch 1 (~40 tokens/s on an A100; assumption, not measured here).
ENGINES = {"vllm": {"mbu": 0.6, "step_overhead_s": 0.0}, "hf": {"mbu": 0.3, "step_overhead_s": 0.025}}

# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class Precision:
    name: str
    weight: int  # bytes per parameter
    grad: int
    optimizer: int  # Adam: fp32 master copy (mixed precision only) and two fp32 moments
    activation: int  # bytes per activation element


# Rajbhandari et al. 2020 (ZeRO), sec. 3.1: mixed-precision Adam keeps 2 + 2 + K bytes per parameter, K = 12.
BF16_MIXED = Precision("bf16 mixed", 2, 2, 12, 2)
# This project's shipped infra/deepspeed/zero2.json and zero3.json (bf16 and fp16 off) and its fp32 model loads.
FP32 = Precision("fp32", 4, 4, 8, 4)
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}

# Korthikanti et al. 2022 (Reducing Activation Recomputation), eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit;
# the 5as/h term is the attention-score matrix, which flash attention never stores, so it is left out.
ACTIVATION_ELEMENTS_PER_TOKEN_HIDDEN = 17  # 34 bytes / 2 bytes per element
MICRO_BATCH_SEQUENCES = 4  # sequences per GPU per forward/backward in training


def model_states_bytes(params: float, precision: Precision, zero_stage: int, n_gpus: int) -> float:
    """Weights + gradients + Adam states per GPU (ZeRO paper, sec. 5.1-5.3): stage 0 (plain data parallel) keeps
    all on every GPU; stage 2 shards gradients and optimizer states over the n_gpus; stage 3 the weights too."""
    w, g, o = (params * b for b in (precision.weight, precision.grad, precision.optimizer))
    if zero_stage == 0:
        return w + g + o
    if zero_stage == 2:
        return w + (g + o) / n_gpus
    if zero_stage == 3:
        return (w + g + o) / n_gpus
    raise ValueError(f"zero_stage {zero_stage}: the model knows 0 (plain), 2 and 3")


def activation_bytes(model: Transformer, tokens: float, precision: Precision, checkpointing: bool) -> float:
    """Activations a backward needs for `tokens` tokens of one micro-batch: 17 elements per token per hidden unit
    per layer (Korthikanti et al. eq. 1, flash attention); with gradient checkpointing only each layer's input is
    kept, plus one layer's full set while it is recomputed."""
    per_layer = ACTIVATION_ELEMENTS_PER_TOKEN_HIDDEN * tokens * model.hidden * precision.activation
    if not checkpointing:
        return model.layers * per_layer
    return model.layers * tokens * model.hidden * precision.activation + per_layer


def logits_bytes(model: Transformer, tokens: float) -> float:
    """The LM head's fp32 logits for `tokens` positions (the log-softmax of the PPO / SFT loss reads them)."""
    return tokens * model.vocab * 4


def kv_bytes_per_token(model: Transformer, bytes_per_element: int) -> float:
    """KV cache of one token: a key and a value vector per layer per KV head."""
    return 2 * model.layers * model.kv_heads * model.head_dim * bytes_per_element


def training_memory_bytes(model: Transformer, precision: Precision, zero_stage: int, n_gpus: int,
                          sequence_tokens: int, checkpointing: bool, lm_head: bool) -> float:
    """One trained model per GPU: its ZeRO-sharded states and one micro-batch's activations (and logits)."""
    tokens = MICRO_BATCH_SEQUENCES * sequence_tokens
    extra = logits_bytes(model, tokens) if lm_head else 0.0
    return (model_states_bytes(model.params, precision, zero_stage, n_gpus)
            + activation_bytes(model, tokens, precision, checkpointing) + extra)


def usable_bytes(gpu: Gpu) -> float:
    return gpu.memory_bytes * USABLE_MEMORY_FRACTION


# ---------------------------------------------------------------- time


def train_flops(params: float, tokens: float, checkpointing: bool) -> float:
    """6N per trained token (forward 2N, backward 4N; Kaplan et al. 2020); checkpointing runs the forward twice: 8N."""
    return (8 if checkpointing else 6) * params * tokens


def forward_flops(params: float, tokens: float) -> float:
    """2N per token of a forward-only pass (scoring, prefill)."""
    return 2 * params * tokens


def compute_seconds(flops: float, n_gpus: int, gpu: Gpu, mfu: float) -> float:
    """Time of `flops` spread evenly over n_gpus at the given model FLOP utilisation."""
    return flops / (n_gpus * gpu.peak_flops * mfu)


def allreduce_bytes_per_s(n_gpus: int) -> float:
    """A ring's per-GPU bandwidth: NVLink inside one node, the InfiniBand NIC once the ring leaves it."""
    return INTRA_NODE_BYTES_PER_S if n_gpus <= GPUS_PER_NODE else INTER_NODE_BYTES_PER_S


def gradient_sync_seconds(params: float, precision: Precision, zero_stage: int, n_gpus: int, steps: int) -> float:
    """Communication of `steps` optimiser steps, not overlapped with compute. Plain data parallelism and ZeRO-2
    move 2 * grad bytes * N * (n-1)/n per GPU per step (reduce-scatter + all-gather); ZeRO-3 1.5 times that
    (the weights gathered for the forward and again for the backward; ZeRO paper, sec. 7)."""
    if n_gpus == 1:
        return 0.0
    volume = 2 * precision.grad * params * (n_gpus - 1) / n_gpus * (1.5 if zero_stage == 3 else 1.0)
    return steps * volume / allreduce_bytes_per_s(n_gpus)


def decode_step_seconds(gpu: Gpu, engine: str, bytes_read: float, flops: float, tensor_parallel: int) -> float:
    """One token step of a batch on a tensor-parallel group: the slower of reading the weights and the KV cache
    (bandwidth x MBU) and the step's FLOPs (peak x forward MFU), plus the engine's fixed cost per step."""
    e = ENGINES[engine]
    memory = bytes_read / (tensor_parallel * gpu.hbm_bytes_per_s * e["mbu"])
    compute = flops / (tensor_parallel * gpu.peak_flops * FORWARD_MFU)
    return max(memory, compute) + e["step_overhead_s"]


def smallest_tensor_parallel(weight_bytes: float, gpu: Gpu, limit: int) -> int | None:
    """The smallest power-of-two tensor-parallel group whose weight share leaves a fifth of the GPU for the KV cache."""
    tp = 1
    while tp <= limit:
        if weight_bytes / tp <= 0.8 * usable_bytes(gpu):
            return tp
        tp *= 2
    return None


def generation(model: Transformer, gpu: Gpu, engine: str, n_sequences: int, prompt_tokens: int,
               response_tokens: int, n_gpus: int, tensor_parallel: int, weight_bytes_per_param: int,
               free_bytes_per_gpu: float) -> dict:
    """Sampling n_sequences responses of response_tokens after prompt_tokens on n_gpus (replicas of
    tensor_parallel GPUs each): every replica runs its share in waves as large as the free memory holds in KV
    cache; a wave is a prefill (2N per prompt token) and response_tokens decode steps at the mean context."""
    replicas = n_gpus // tensor_parallel
    per_replica = math.ceil(n_sequences / replicas)
    kv_token = kv_bytes_per_token(model, weight_bytes_per_param)  # the cache is kept in the weights' dtype
    kv_sequence = kv_token * (prompt_tokens + response_tokens)  # a sequence's cache at its longest
    batch = min(per_replica, int(free_bytes_per_gpu * tensor_parallel // kv_sequence))
    if batch < 1:
        return {"fits": False, "seconds": None, "batch": 0, "waves": None, "kv_bytes_per_gpu": None}
    waves = math.ceil(per_replica / batch)
    weights = model.params * weight_bytes_per_param
    mean_context = prompt_tokens + response_tokens / 2
    step = decode_step_seconds(gpu, engine, weights + batch * mean_context * kv_token,
                               forward_flops(model.params, batch), tensor_parallel)
    prefill = compute_seconds(forward_flops(model.params, batch * prompt_tokens), tensor_parallel, gpu, FORWARD_MFU)
    return {"fits": True, "seconds": waves * (prefill + response_tokens * step), "batch": batch, "waves": waves,
            "kv_bytes_per_gpu": batch * kv_sequence / tensor_parallel}


# ---------------------------------------------------------------- this pipeline's stages


@dataclass(frozen=True)
class Workload:
    """What one round does per 1,024 prompts, at the lengths of DeepSpeed-Chat's benchmark setting (256 prompt
    and 256 response tokens, its blog's "very important details") and this project's stage defaults."""

    prompts: int = 1024
    prompt_tokens: int = 256
    response_tokens: int = 256
    generation_responses_per_prompt: int = 4  # the default generation plan: 2 strategies x n 2
    pairs: int = 1024  # one comparison pair per prompt
    voters: int = 10  # voting.n_models (Secrets of RLHF II: 10)
    voter_epochs: int = 1  # voting.train epochs
    reward_epochs: int = 2  # reward.train.epochs
    ppo_responses_per_prompt: int = 2  # ppo.responses_per_prompt (Qwen: two per query)
    ppo_epochs: int = 2  # ppo.ppo_epochs
    batch_sequences: int = 128  # sequences (pairs for reward models) per optimiser step at this scale

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens


@dataclass(frozen=True)
class Setup:
    policy: Transformer
    gpu: Gpu
    n_gpus: int
    zero_stage: int
    precision: Precision
    checkpointing: bool = True


def _result(stage: str, memory: float, fits: bool, seconds: float | None, **detail) -> dict:
    return {"stage": stage, "memory_gb": memory / 1e9, "fits": bool(fits), "seconds": seconds, **detail}


def trained_stage(s: Setup, w: Workload, stage: str, model: Transformer, sequences: float, epochs: int) -> dict:
    """A model trained over all GPUs under the setup's ZeRO stage (SFT, the reward model, one voter)."""
    memory = training_memory_bytes(model, s.precision, s.zero_stage, s.n_gpus, w.sequence_tokens,
                                   s.checkpointing, lm_head=True)
    tokens = sequences * w.sequence_tokens * epochs
    steps = math.ceil(sequences / w.batch_sequences) * epochs
    seconds = (compute_seconds(train_flops(model.params, tokens, s.checkpointing), s.n_gpus, s.gpu, TRAIN_MFU)
               + gradient_sync_seconds(model.params, s.precision, s.zero_stage, s.n_gpus, steps))
    return _result(stage, memory, memory <= usable_bytes(s.gpu), seconds)


def sft_stage(s: Setup, w: Workload) -> dict:
    """Supervised fine-tuning on one demonstration per prompt, one epoch."""
    return trained_stage(s, w, "sft", s.policy, w.prompts, 1)


def reward_stage(s: Setup, w: Workload) -> dict:
    """The reward model on the denoised pairs (chosen and rejected: two sequences a pair)."""
    return trained_stage(s, w, "reward", s.policy, 2 * w.pairs, w.reward_epochs)


def generation_stage(s: Setup, w: Workload) -> dict:
    """The annotation responses: transformers' generate on every GPU, each holding the whole policy (this
    project's generation with num_processes = N has no tensor parallelism)."""
    weights = s.policy.params * s.precision.weight
    free = usable_bytes(s.gpu) - weights
    gen = generation(s.policy, s.gpu, "hf", w.prompts * w.generation_responses_per_prompt, w.prompt_tokens,
                     w.response_tokens, s.n_gpus, 1, s.precision.weight, free)
    memory = weights + (gen["kv_bytes_per_gpu"] or 0.0)
    return _result("generation", memory, gen["fits"], gen["seconds"], batch=gen["batch"], waves=gen["waves"])


def voter_work_seconds(s: Setup, w: Workload, n_gpus: int, zero_stage: int) -> float:
    """One voter (a whole reward-model training, then scoring every pair) on n_gpus."""
    tokens = 2 * w.pairs * w.sequence_tokens
    flops = train_flops(s.policy.params, tokens * w.voter_epochs, s.checkpointing) + forward_flops(s.policy.params, tokens)
    steps = math.ceil(2 * w.pairs / w.batch_sequences) * w.voter_epochs
    return (compute_seconds(flops, n_gpus, s.gpu, TRAIN_MFU)
            + gradient_sync_seconds(s.policy.params, s.precision, zero_stage, n_gpus, steps))


def voter_memory(s: Setup, w: Workload, n_gpus: int, zero_stage: int) -> float:
    return training_memory_bytes(s.policy, s.precision, zero_stage, n_gpus, w.sequence_tokens, s.checkpointing,
                                 lm_head=True)


def voting_stage(s: Setup, w: Workload) -> dict:
    """M voters spread over the GPUs, three ways. Side by side, one voter per GPU (what voting.num_processes does
    today: voter k on rank k mod N, no ZeRO): ceil(M / N) waves. Side by side in groups: each voter under ZeRO-3
    over the smallest power-of-two group it fits in, N / group voters at a time. Data parallel inside each voter:
    every voter over all N GPUs under the setup's ZeRO stage, the M voters one after the other. The row's memory
    and time are the last (the one comparable with the other stages' ZeRO setting)."""
    one_per_gpu_memory = voter_memory(s, w, 1, 0)
    one_per_gpu_fits = one_per_gpu_memory <= usable_bytes(s.gpu)
    one_per_gpu = (math.ceil(w.voters / s.n_gpus) * voter_work_seconds(s, w, 1, 0)) if one_per_gpu_fits else None
    group = next((g for g in (1, 2, 4, 8, 16, 32, 64) if g <= s.n_gpus
                  and voter_memory(s, w, g, 3 if g > 1 else 0) <= usable_bytes(s.gpu)), None)
    grouped = (math.ceil(w.voters / (s.n_gpus // group)) * voter_work_seconds(s, w, group, 3 if group > 1 else 0)
               if group else None)
    inside_memory = voter_memory(s, w, s.n_gpus, s.zero_stage)
    inside_fits = inside_memory <= usable_bytes(s.gpu)
    inside = w.voters * voter_work_seconds(s, w, s.n_gpus, s.zero_stage) if inside_fits else None
    return _result("voting", inside_memory, inside_fits, inside, one_voter_per_gpu_gb=one_per_gpu_memory / 1e9,
                   one_voter_per_gpu_seconds=one_per_gpu, voter_group_gpus=group, voter_groups_seconds=grouped)


def ppo_static_bytes(s: Setup, frozen_sharded: bool) -> float:
    """What PPO keeps on a GPU the whole time: the policy's and the critic's ZeRO-sharded states, the frozen
    reference and reward model (whole on every rank in this project; partitioned over the GPUs when sharded),
    and under ZeRO-3 the project's whole copy of the policy that generation runs on (none when sharded: the
    rollout engine then holds a tensor-parallel share, counted with generation)."""
    p = s.policy.params
    engines = 2 * model_states_bytes(p, s.precision, s.zero_stage, s.n_gpus)  # policy and critic (same size)
    frozen = 2 * p * s.precision.weight / (s.n_gpus if frozen_sharded else 1)
    twin = p * s.precision.weight if (s.zero_stage == 3 and not frozen_sharded) else 0.0
    return engines + frozen + twin


def ppo_stage(s: Setup, w: Workload, frozen_sharded: bool = False) -> dict:
    """One PPO iteration over the rollout of 1,024 prompts, everything on the same N GPUs in turn: generation
    (transformers' generate on every rank in this project; with frozen_sharded, a vLLM-like engine on
    tensor-parallel groups), scoring (policy and reference log-probs, critic values, reward: one forward each),
    training (policy and critic, ppo_epochs passes), gradient communication."""
    p, seqs = s.policy.params, w.prompts * w.ppo_responses_per_prompt
    tokens = seqs * w.sequence_tokens
    static = ppo_static_bytes(s, frozen_sharded)
    train_tokens = MICRO_BATCH_SEQUENCES * w.sequence_tokens
    activations = (activation_bytes(s.policy, train_tokens, s.precision, s.checkpointing)
                   + logits_bytes(s.policy, train_tokens))
    if frozen_sharded:
        engine = "vllm"
        tp = smallest_tensor_parallel(p * s.precision.weight, s.gpu, s.n_gpus) or s.n_gpus
        rollout_weights = p * s.precision.weight / tp
    else:
        engine, tp, rollout_weights = "hf", 1, 0.0  # the whole policy is already counted in `static`
    free = usable_bytes(s.gpu) - static - rollout_weights
    gen = generation(s.policy, s.gpu, engine, seqs, w.prompt_tokens, w.response_tokens, s.n_gpus, tp,
                     s.precision.weight, free)
    memory = static + rollout_weights + max(activations, gen["kv_bytes_per_gpu"] or 0.0)
    fits = gen["fits"] and static + activations <= usable_bytes(s.gpu)
    scoring = compute_seconds(4 * forward_flops(p, tokens), s.n_gpus, s.gpu, FORWARD_MFU)
    training = compute_seconds(2 * train_flops(p, tokens * w.ppo_epochs, s.checkpointing), s.n_gpus, s.gpu, TRAIN_MFU)
    steps = math.ceil(seqs / w.batch_sequences) * w.ppo_epochs
    communication = 2 * gradient_sync_seconds(p, s.precision, s.zero_stage, s.n_gpus, steps)
    parts = {"generation": gen["seconds"], "scoring": scoring, "training": training, "communication": communication}
    total = None if gen["seconds"] is None else sum(parts.values())
    return _result("ppo (frozen sharded, TP rollout)" if frozen_sharded else "ppo", memory, fits, total,
                   phases=parts, generation_share=None if total is None else gen["seconds"] / total,
                   rollout_batch=gen["batch"], rollout_waves=gen["waves"], rollout_tensor_parallel=tp)


def pipeline_table(gpu: Gpu, w: Workload) -> list[dict]:
    """Every stage for 7B and 70B policies on 8-64 GPUs, ZeRO-2 and ZeRO-3, fp32 (this project's shipped
    DeepSpeed configs) and bf16 mixed precision."""
    rows = []
    for size, policy in POLICIES.items():
        for precision_name, precision in PRECISIONS.items():
            for zero_stage in (2, 3):
                for n_gpus in (8, 16, 32, 64):
                    s = Setup(policy, gpu, n_gpus, zero_stage, precision)
                    key = {"policy": size, "precision": precision_name, "zero_stage": zero_stage, "gpus": n_gpus}
                    for stage in (sft_stage(s, w), generation_stage(s, w), voting_stage(s, w), reward_stage(s, w),
                                  ppo_stage(s, w), ppo_stage(s, w, frozen_sharded=True)):
                        rows.append(key | stage)
    return rows


# ---------------------------------------------------------------- checks against published timings

# OpenRLHF's README (2024) and technical report (Hu et al. 2024, arXiv 2405.11143, v1-v3): average seconds to
# train 1,024 prompts with 1 PPO epoch, Llama-2 7B actor, critic, reward and reference on 16 A800-80GB: OpenRLHF
# 471.11, DeepSpeed-Chat "optimized" (Adam, reward and reference offload, Hybrid Engine fixed for Llama 2) 855.09.
# The paper's figure splits DeepSpeed-Chat's 855.09 s into generation 590.157 s and training 125.69 s (quoted in
# OpenRLHF issue #327). Their scripts of that time: --prompt_max_len 1024 --generate_max_len 1024, bf16, ZeRO-2
# with Adam offload, gradient checkpointing, flash attention, 1 sample per prompt.
OPENRLHF_7B_SECONDS, DSCHAT_7B_SECONDS = 471.11, 855.09
DSCHAT_7B_PHASES = {"generation": 590.157, "training": 125.69}
OPENRLHF_70B_SECONDS, DSCHAT_70B_SECONDS = 4488.53, 10407.0  # the same table: Llama-2 70B on 32 A800-80GB
# Where each model ran: (vLLM GPUs, vLLM tensor-parallel size, [(models sharing GPUs, GPUs)]). The 7B split of the
# 16 was not found in the sources read here; assumed from the maintainers' advice (vLLM : actor : critic =
# 1 : 1 : 1, OpenRLHF issue #562) with the reward and reference models on 2 GPUs each. The 70B split is the README's
# tuning guide for 32 GPUs (16 to vLLM, 8 engines of tensor parallel 2 per issue #566; actor with reference and
# critic with reward colocated on 8 each).
OPENRLHF_7B_LAYOUT = (4, 1, [(("actor",), 4), (("critic",), 4), (("reward",), 2), (("reference",), 2)])
OPENRLHF_70B_LAYOUT = (16, 2, [(("actor", "reference"), 8), (("critic", "reward"), 8)])
# DeepSpeed-Chat's README, Table 1 (step 3, OPT actors with a 350M OPT critic and reward model, A100-80GB):
# 131.9k queries of 256 tokens answered with 256 tokens, 1,024 query-answer pairs per step, 1 epoch.
DSCHAT_QUERIES = 131_900
DSCHAT_TABLE = [(OPT_6_7B, 8, 4.1), (OPT_13B, 8, 9.0), (OPT_13B, 64, 1.25), (OPT_66B, 64, 7.5)]  # (actor, GPUs, hours)
AGREEMENT_TOLERANCE = 0.30  # the issue's bar: a model more than 30 % off says why
PUBLISHED_TRAIN_BATCH = 128  # sequences per optimiser step: OpenRLHF's --train_batch_size; assumed for DeepSpeed-Chat


def openrlhf_ppo(policy: Transformer, gpu: Gpu, layout: tuple, prompts: int, prompt_tokens: int,
                 response_tokens: int) -> dict:
    """OpenRLHF's layout: vLLM engines on their own GPUs generate; then every GPU group scores with its models (one
    after the other inside a group, the groups at the same time: the slowest sets the pace); then actor and critic
    train at the same time (ZeRO inside each group); all four models the policy's size, bf16, gradient
    checkpointing, 1 PPO epoch."""
    vllm_gpus, vllm_tp, groups = layout
    tokens = prompts * (prompt_tokens + response_tokens)
    free = usable_bytes(gpu) - policy.params * BF16_MIXED.weight / vllm_tp
    gen = generation(policy, gpu, "vllm", prompts, prompt_tokens, response_tokens, vllm_gpus, vllm_tp,
                     BF16_MIXED.weight, free)
    scoring = max(compute_seconds(forward_flops(len(models) * policy.params, tokens), n, gpu, FORWARD_MFU)
                  for models, n in groups)
    trained = [n for models, n in groups for m in models if m in ("actor", "critic")]
    training = max(compute_seconds(train_flops(policy.params, tokens, True), n, gpu, TRAIN_MFU) for n in trained)
    steps = math.ceil(prompts / PUBLISHED_TRAIN_BATCH)
    zero_stage = 3 if policy.params > 20e9 else 2  # the 70B script runs ZeRO-3, the 7B ones ZeRO-2
    communication = max(gradient_sync_seconds(policy.params, BF16_MIXED, zero_stage, n, steps) for n in trained)
    return {"generation": gen["seconds"], "scoring": scoring, "training": training, "communication": communication}


def _layout_text(layout: tuple) -> str:
    vllm_gpus, vllm_tp, groups = layout
    return f"vLLM {vllm_gpus} GPUs (tensor parallel {vllm_tp}), " + ", ".join(
        f"{' + '.join(models)} {n}" for models, n in groups)


def dschat_ppo(actor: Transformer, critic: Transformer, gpu: Gpu, n_gpus: int, prompts: int, prompt_tokens: int,
               response_tokens: int) -> dict:
    """DeepSpeed-Chat's layout: all four models on the same GPUs, actor and critic under ZeRO-3 (bf16), the
    Hybrid Engine generating on the gathered actor (modelled as transformers' generate; tensor parallel over the
    smallest group the weights fit in; Adam states offloaded to the CPU when they do not fit, CPU time not
    counted), then the four forwards,
    then actor and critic training one after the other (gradient checkpointing, ZeRO-3 communication), 1 PPO epoch."""
    tokens = prompts * (prompt_tokens + response_tokens)
    weights = actor.params * BF16_MIXED.weight
    tp = smallest_tensor_parallel(weights, gpu, n_gpus) or n_gpus  # the Hybrid Engine's inference_tp_size
    states = model_states_bytes(actor.params + critic.params, BF16_MIXED, 3, n_gpus)
    if states + weights / tp > usable_bytes(gpu):  # ZeRO-Offload: Adam states on the CPU (its 70B recipe)
        states = (actor.params + critic.params) * (BF16_MIXED.weight + BF16_MIXED.grad) / n_gpus
    resident = states + weights / tp  # + the Hybrid Engine's gathered actor (its tensor-parallel share)
    gen = generation(actor, gpu, "hf", prompts, prompt_tokens, response_tokens, n_gpus, tp, BF16_MIXED.weight,
                     usable_bytes(gpu) - resident)
    scoring = compute_seconds(forward_flops(2 * actor.params + 2 * critic.params, tokens), n_gpus, gpu, FORWARD_MFU)
    training = compute_seconds(train_flops(actor.params + critic.params, tokens, True), n_gpus, gpu, TRAIN_MFU)
    steps = math.ceil(prompts / PUBLISHED_TRAIN_BATCH)
    communication = sum(gradient_sync_seconds(m.params, BF16_MIXED, 3, n_gpus, steps) for m in (actor, critic))
    return {"generation": gen["seconds"], "scoring": scoring, "training": training, "communication": communication}


def _check(name: str, published: float, phases: dict, setup: str, **extra) -> dict:
    modelled = sum(phases.values())
    ratio = modelled / published
    return {"name": name, "setup": setup, "published_seconds": published, "modelled_seconds": modelled,
            "phases": phases, "ratio": ratio, "within_tolerance": abs(ratio - 1) <= AGREEMENT_TOLERANCE, **extra}


def published_checks() -> list[dict]:
    """The model against every published timing above, at the published setups."""
    checks = []
    for label, (prompt_tokens, response_tokens) in (("length caps 1024 + 1024", (1024, 1024)),
                                                    ("half the caps, 512 + 512", (512, 512))):
        for policy, n_gpus, layout, openrlhf, dschat in ((LLAMA2_7B, 16, OPENRLHF_7B_LAYOUT, OPENRLHF_7B_SECONDS,
                                                          DSCHAT_7B_SECONDS),
                                                         (LLAMA2_70B, 32, OPENRLHF_70B_LAYOUT, OPENRLHF_70B_SECONDS,
                                                          DSCHAT_70B_SECONDS)):
            setup = f"{policy.name} x4, {n_gpus} A800, 1,024 prompts, {label} tokens"
            checks.append(_check(f"OpenRLHF {policy.name} ({label})", openrlhf,
                                 openrlhf_ppo(policy, A100_80GB, layout, 1024, prompt_tokens, response_tokens),
                                 f"{setup}, {_layout_text(layout)}"))
            phases = {"published_phases": DSCHAT_7B_PHASES} if policy is LLAMA2_7B else {}
            checks.append(_check(f"DeepSpeed-Chat {policy.name} ({label})", dschat,
                                 dschat_ppo(policy, policy, A100_80GB, n_gpus, 1024, prompt_tokens, response_tokens),
                                 f"{setup}, all models on all {n_gpus}", **phases))
    steps = DSCHAT_QUERIES / 1024
    for actor, n_gpus, hours in DSCHAT_TABLE:
        checks.append(_check(f"DeepSpeed-Chat {actor.name} on {n_gpus} A100-80GB", hours * 3600 / steps,
                             dschat_ppo(actor, OPT_350M, A100_80GB, n_gpus, 1024, 256, 256),
                             f"{actor.name} actor, OPT-350M critic and reward, 1,024 pairs of 256 + 256 tokens "
                             f"({hours} h for {DSCHAT_QUERIES:,} queries = {steps:.1f} steps)"))
    return checks


def response_length_shares(gpu: Gpu, lengths: tuple[int, ...] = (256, 512, 1024)) -> list[dict]:
    """PPO's generation share as responses grow (7B, ZeRO-3, bf16, 8 GPUs): decoding grows with the length times
    the context, training only with the length."""
    rows = []
    for response_tokens in lengths:
        w, s = Workload(response_tokens=response_tokens), Setup(LLAMA2_7B, gpu, 8, 3, BF16_MIXED)
        for stage in (ppo_stage(s, w), ppo_stage(s, w, frozen_sharded=True)):
            rows.append({"response_tokens": response_tokens} | stage)
    return rows


# ---------------------------------------------------------------- output

ASSUMPTIONS = [  # (name, value, source): the doc's table of every constant the times rest on
    ("TRAIN_MFU", TRAIN_MFU, "PaLM (Chowdhery et al. 2022) Table 3: 21-46 % for large-scale training; Megatron-Turing NLG on A100 30.2 %"),
    ("FORWARD_MFU", FORWARD_MFU, "taken equal to training's (assumption)"),
    ("vllm MBU / step cost", f"{ENGINES['vllm']['mbu']} / {ENGINES['vllm']['step_overhead_s']} s",
     "assumption of the order tuned servers report (MBU as Databricks 2023 defines it)"),
    ("hf MBU / step cost", f"{ENGINES['hf']['mbu']} / {ENGINES['hf']['step_overhead_s']} s",
     "assumption: eager transformers `generate`, ~40 tokens/s for a 7B at batch 1 on an A100"),
    ("A100/A800 80GB", "312 TFLOP/s bf16, 2.039 TB/s", "NVIDIA A100 datasheet (A800: same chip, NVLink 400 GB/s)"),
    ("H100 80GB", "989 TFLOP/s bf16, 3.35 TB/s", "NVIDIA H100 SXM datasheet"),
    ("all-reduce bandwidth per GPU", f"{INTRA_NODE_BYTES_PER_S / 1e9:.0f} GB/s in a node, {INTER_NODE_BYTES_PER_S / 1e9:.0f} GB/s across",
     "DGX A100: NVLink 3 (~80 % of 300 GB/s each way), one 200 Gb/s HDR NIC per GPU; not overlapped with compute"),
    ("usable memory", f"{USABLE_MEMORY_FRACTION:.0%} of 80 GiB", "CUDA context and fragmentation (vLLM's gpu_memory_utilization default)"),
    ("bytes per parameter", "bf16 mixed 2 + 2 + 12; fp32 4 + 4 + 8", "ZeRO (Rajbhandari et al. 2020) sec. 3.1; fp32 keeps no master copy"),
    ("activations", "17 elements x tokens x hidden per layer; checkpointing: 1 per layer + one layer's 17",
     "Korthikanti et al. 2022 eq. 1 without the attention-score term (flash attention)"),
    ("training FLOPs", "6N per token, 8N with checkpointing; 2N per forward token", "Kaplan et al. 2020"),
    ("micro-batch", f"{MICRO_BATCH_SEQUENCES} sequences per GPU", "assumption"),
]


def run_model(gpu: Gpu) -> dict:
    w = Workload()
    return {"gpu": asdict(gpu), "workload": asdict(w), "policies": {k: asdict(v) for k, v in POLICIES.items()},
            "assumptions": [{"name": n, "value": v, "source": src} for n, v, src in ASSUMPTIONS],
            "stages": pipeline_table(gpu, w), "response_length_shares": response_length_shares(gpu),
            "checks": published_checks(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


COLUMNS = [(z, n) for z in (2, 3) for n in (8, 16, 32, 64)]
STAGES = ("sft", "generation", "voting", "reward", "ppo", "ppo (frozen sharded, TP rollout)")


def _find(rows: list[dict], **key) -> dict:
    return next(r for r in rows if all(r[k] == v for k, v in key.items()))


def _cell(row: dict, value: float | None, digits: int = 0) -> str:
    text = "n/a" if value is None else f"{value:,.{digits}f}"
    return text if row["fits"] else f"{text} ✗"


def stage_table(rows: list[dict], precision: str, field: str) -> str:
    """Rows (policy, stage), columns ZeRO-2 and ZeRO-3 on 8-64 GPUs; ✗ marks a setup that does not fit."""
    head = "| policy | stage | " + " | ".join(f"ZeRO-{z}, {n}" for z, n in COLUMNS) + " |\n"
    head += "|---|---|" + "---|" * len(COLUMNS) + "\n"
    body = ""
    for policy in POLICIES:
        for stage in STAGES:
            cells = [_find(rows, policy=policy, precision=precision, zero_stage=z, gpus=n, stage=stage) for z, n in COLUMNS]
            body += f"| {policy} | {stage} | " + " | ".join(_cell(c, c[field]) for c in cells) + " |\n"
    return head + body


def ppo_phase_table(rows: list[dict], stage: str) -> str:
    head = ("| policy | ZeRO | GPUs | generation | scoring | training | communication | total | generation share | "
            "rollout batch per replica x waves |\n|---|---|---|---|---|---|---|---|---|---|\n")
    body = ""
    for policy in POLICIES:
        for z, n in COLUMNS:
            r = _find(rows, policy=policy, precision="bf16", zero_stage=z, gpus=n, stage=stage)
            ph = r["phases"]
            share = "n/a" if r["generation_share"] is None else f"{r['generation_share']:.0%}"
            body += (f"| {policy} | {z} | {n} | " + " | ".join(_cell(r, ph[k]) for k in ph)
                     + f" | {_cell(r, r['seconds'])} | {share} | {r['rollout_batch'] or 'n/a'} x {r['rollout_waves'] or 'n/a'} |\n")
    return head + body


def voting_table(rows: list[dict]) -> str:
    head = ("| policy | GPUs | one voter per GPU (today) | smallest ZeRO-3 group a voter fits | voters side by side in "
            "such groups | data parallel inside each voter, ZeRO-2 | same, ZeRO-3 |\n|---|---|---|---|---|---|---|\n")
    body = ""
    for policy in POLICIES:
        for n in (8, 16, 32, 64):
            z2, z3 = (_find(rows, policy=policy, precision="bf16", zero_stage=z, gpus=n, stage="voting") for z in (2, 3))
            today = (f"{z2['one_voter_per_gpu_seconds']:,.0f} s" if z2["one_voter_per_gpu_seconds"]
                     else f"does not fit ({z2['one_voter_per_gpu_gb']:,.0f} GB)")
            group = f"{z2['voter_group_gpus']} GPUs" if z2["voter_group_gpus"] else "none"
            grouped = f"{z2['voter_groups_seconds']:,.0f} s" if z2["voter_groups_seconds"] else "n/a"
            inside = [f"{r['seconds']:,.0f} s" if r["fits"] else f"does not fit ({r['memory_gb']:,.0f} GB)" for r in (z2, z3)]
            body += f"| {policy} | {n} | {today} | {group} | {grouped} | {inside[0]} | {inside[1]} |\n"
    return head + body


def length_table(rows: list[dict]) -> str:
    head = "| response tokens | layout | generation | total | generation share |\n|---|---|---|---|---|\n"
    return head + "".join(
        f"| {r['response_tokens']} | {r['stage']} | {_cell(r, r['phases']['generation'])} | {_cell(r, r['seconds'])} | "
        f"{r['generation_share']:.0%} |\n" for r in rows)


def checks_table(checks: list[dict]) -> str:
    head = ("| published | setup | published s | modelled s (generation / scoring / training / communication) | "
            "model / published |\n|---|---|---|---|---|\n")
    body = ""
    for c in checks:
        phases = " / ".join(f"{v:,.0f}" for v in c["phases"].values())
        flag = "" if c["within_tolerance"] else " (off by more than 30 %)"
        body += (f"| {c['name']} | {c['setup']} | {c['published_seconds']:,.1f} | {c['modelled_seconds']:,.0f} "
                 f"({phases}) | {c['ratio']:.2f}{flag} |\n")
    return head + body


def markdown_section(result: dict, command: str) -> str:
    w, rows, gpu = result["workload"], result["stages"], result["gpu"]
    assumptions = "".join(f"| {a['name']} | {a['value']} | {a['source']} |\n" for a in result["assumptions"])
    return f"""{SECTION_START}
## The model's numbers (written by `benchmarks/scale_out.py`, {result['date']})

    {command}

GPU: {gpu['name']}. Workload per 1,024 prompts: prompts of {w['prompt_tokens']} tokens, responses of
{w['response_tokens']} (DeepSpeed-Chat's benchmark lengths); generation {w['generation_responses_per_prompt']}
responses per prompt; {w['pairs']:,} comparison pairs; {w['voters']} voters of {w['voter_epochs']} epoch; the reward
model {w['reward_epochs']} epochs; PPO {w['ppo_responses_per_prompt']} responses per prompt and {w['ppo_epochs']}
epochs; {w['batch_sequences']} sequences per optimiser step; gradient checkpointing on; the reward model and
critic as large as the policy. ✗: does not fit in the GPU's usable memory (a time beside ✗ is what the stage
would take if the memory were found).

Assumptions (each a named constant in the script):

| constant | value | source |
|---|---|---|
{assumptions}
### Memory per GPU (GB), bf16 mixed precision

{stage_table(rows, 'bf16', 'memory_gb')}
### Memory per GPU (GB), fp32 (this project's shipped `zero2` / `zero3` configs and fp32 model loads)

{stage_table(rows, 'fp32', 'memory_gb')}
### Time per 1,024 prompts (seconds), bf16 mixed precision

{stage_table(rows, 'bf16', 'seconds')}
### PPO by phase (seconds per 1,024 prompts, bf16): this project's layout

`ppo`: reference and reward model whole on every GPU, ZeRO-3's whole policy copy for generation, transformers'
`generate` on every rank.

{ppo_phase_table(rows, 'ppo')}
### PPO by phase: frozen models sharded, tensor-parallel vLLM-like rollout (what a 70B run needs)

{ppo_phase_table(rows, 'ppo (frozen sharded, TP rollout)')}
### Voting: {w['voters']} voters over the GPUs (bf16)

{voting_table(rows)}
### PPO's generation share against the response length (7B, ZeRO-3, bf16, 8 GPUs)

{length_table(result['response_length_shares'])}
### Checks against published timings (seconds per 1,024 prompts)

{checks_table(result['checks'])}{SECTION_END}
"""


def plot_ppo_phases(result: dict, path: Path) -> None:
    """Stacked bars of PPO's phases per 1,024 prompts, 7B and 70B, bf16 ZeRO-3, frozen models sharded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    gpus = (8, 16, 32, 64)
    for ax, policy in zip(axes, POLICIES):
        rows = [_find(result["stages"], policy=policy, precision="bf16", zero_stage=3, gpus=n,
                      stage="ppo (frozen sharded, TP rollout)") for n in gpus]
        bottom = [0.0] * len(gpus)
        for phase in ("generation", "scoring", "training", "communication"):
            values = [r["phases"][phase] if r["fits"] else 0.0 for r in rows]
            ax.bar([str(n) for n in gpus], values, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, r in enumerate(rows):
            if not r["fits"]:
                ax.text(x, 0, f"does not fit\n({r['memory_gb']:,.0f} GB)", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{policy} policy")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("seconds per 1,024 prompts")
    axes[0].legend()
    fig.suptitle("PPO by phase (model, bf16, ZeRO-3, frozen models sharded)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", choices=GPUS, default="a100")
    parser.add_argument("--json", default="docs/scale-out.json")
    parser.add_argument("--doc", default="docs/scale-out.md")
    parser.add_argument("--figure", default="docs/figures/scale-out-ppo.png", help="'' for none")
    args = parser.parse_args(argv)
    result = run_model(GPUS[args.gpu])
    command = "python benchmarks/scale_out.py " + " ".join(sys.argv[1:] if argv is None else argv)
    atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
    replace_section(Path(args.doc), markdown_section(result, command.strip()), SECTION_START, SECTION_END,
                    "# Beyond one machine, on paper\n\n")
    if args.figure:
        plot_ppo_phases(result, Path(args.figure))
    print(json.dumps({c["name"]: round(c["ratio"], 2) for c in result["checks"]}))
    return result


if __name__ == "__main__":
    main()
