"""Optional vLLM backend: the same rows as the transformers backend, from a vLLM engine on a CUDA GPU.

Importing this module never imports vllm; `generate_with_vllm` does. Not bit-identical to the
transformers backend (other kernels, other random streams), but deterministic for a seed: every
(prompt, strategy) request carries its own seed.

Limits: one process (vLLM batches and schedules itself; run it with generation.num_processes 1),
one GPU per engine. Untested on this project's CPU-only machines.
"""

from __future__ import annotations

import functools
import gc
import time

import pandas as pd
import torch

from rlhf_core.generation.plan import (
    ROW_COLUMNS,
    GenerationInputError,
    dedupe,
    generation_report,
    response_row,
    stable_seed,
)
from rlhf_core.models import format_query


@functools.lru_cache(maxsize=1)
def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot run here (no CUDA GPU, or `import vllm` fails), or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    try:
        import vllm  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:  # not installed, or a broken install failing on import
        return f"`import vllm` fails ({type(err).__name__}: {err})"
    return None


def vllm_available() -> bool:
    """True only when `import vllm` works and torch sees a CUDA GPU."""
    return vllm_unavailable_reason() is None


def resolve_backend(backend: str, num_processes: int) -> str:
    """'hf' or 'vllm' for the configured generation.backend; raise when 'vllm' cannot run."""
    if backend == "hf":
        return "hf"
    if backend == "auto":
        return "vllm" if vllm_available() and num_processes == 1 else "hf"
    if backend != "vllm":
        raise GenerationInputError(f"generation.backend: unknown backend {backend!r}; use auto, hf or vllm")
    reason = vllm_unavailable_reason()
    if reason is not None:
        raise GenerationInputError(
            f"generation.backend is 'vllm' but vLLM cannot run here: {reason}; install vllm on a CUDA machine, "
            "or set generation.backend to 'auto' or 'hf'"
        )
    if num_processes != 1:
        raise GenerationInputError(
            f"generation.backend 'vllm' runs in one process (vLLM batches itself), but generation.num_processes "
            f"is {num_processes}; set it to 1, or use backend 'hf' for data-parallel ranks"
        )
    return "vllm"


def load_vllm(model_path: str, seed: int = 0):
    """A vLLM engine for a local Hugging Face directory (its own tokenizer; nothing downloaded)."""
    from vllm import LLM

    return LLM(model=str(model_path), tokenizer=str(model_path), seed=seed, trust_remote_code=False)


def release_vllm(llm) -> None:
    """Free the engine's GPU memory before the next generator's engine starts."""
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None and hasattr(engine_core, "shutdown"):
        engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def generate_with_vllm(model_path: str, prompts: pd.DataFrame, strategies, generator: str, seed: int,
                       llm=None, bar=None) -> tuple[pd.DataFrame, dict]:
    """Return (responses, report) like `plan.generate_responses`, sampled by vLLM.

    `llm`: an engine from `load_vllm(model_path)` to reuse across calls (one is made otherwise).
    Request (prompt, strategy) samples its n responses with `stable_seed(seed, strategy, prompt_id)`.
    """
    from vllm import SamplingParams

    llm = llm or load_vllm(model_path)
    tokenizer = llm.get_tokenizer()
    # Token ids, not text: the query is encoded exactly as the transformers backend encodes it.
    requests = [{"prompt_token_ids": tokenizer(format_query(tokenizer, p), add_special_tokens=False)["input_ids"]}
                for p in prompts["prompt"]]
    rows, n_tokens, start = [], 0, time.time()
    for strategy in strategies:
        greedy = strategy.temperature == 0
        params = [SamplingParams(
            n=1 if greedy else strategy.n,  # greedy samples are identical; dedupe keeps one anyway
            temperature=strategy.temperature, top_p=strategy.top_p, top_k=strategy.top_k or -1,
            repetition_penalty=strategy.repetition_penalty, max_tokens=strategy.max_new_tokens,
            seed=stable_seed(seed, strategy.name, pid), skip_special_tokens=True,
        ) for pid in prompts["prompt_id"]]
        outputs = llm.generate(requests, params, use_tqdm=False)
        for prompt, output in zip(prompts.itertuples(), outputs):
            n_tokens += sum(len(sample.token_ids) for sample in output.outputs)
            samples = output.outputs * strategy.n if greedy else output.outputs
            rows += [response_row(prompt, s.text, generator, strategy, k) for k, s in enumerate(samples[: strategy.n])]
        if bar is not None:
            bar.update(len(prompts) * strategy.n)
    generated = pd.DataFrame(rows, columns=ROW_COLUMNS)
    return dedupe(generated), generation_report(generated, n_tokens, time.time() - start)
