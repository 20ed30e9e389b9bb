"""Loading, building and saving models as Hugging Face directories (safetensors).

Every model this project writes reloads with plain transformers
(`AutoModelForCausalLM` / `AutoModelForSequenceClassification` / `AutoTokenizer`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rlhf_core.config import PolicyModelConfig

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# Plain-text query format for tokenizers without a chat template (the simulated world's).
QUERY_TEMPLATE = "Q: {prompt}\nA:"


def build_tokenizer() -> PreTrainedTokenizerBase:
    """The offline tokenizer of the simulated world: one token per byte, needs no files.

    Ids are ByT5's (pad=0, eos=1, unk=2, byte b -> b + 3), but it is built with `tokenizers` and
    saved as tokenizer.json, so plain `AutoTokenizer.from_pretrained` reloads it exactly (a saved
    ByT5Tokenizer next to a Qwen2 config would be loaded as an empty Qwen2Tokenizer).
    """
    byte_to_char = bytes_to_unicode()  # the printable stand-in of each byte, as in GPT-2
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {byte_to_char[b]: b + 3 for b in range(256)}
    backend = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def build_policy(cfg: PolicyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> Qwen2ForCausalLM:
    """A tiny Qwen2 causal LM from a config: same architecture family as real targets."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def format_query(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """The text a policy is conditioned on: the tokenizer's chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return QUERY_TEMPLATE.format(prompt=prompt)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(path: str | Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def load_reward_model(path: str | Path) -> torch.nn.Module:
    return AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)


def reward_model_from_policy(policy_path: str | Path, seed: int = 0) -> torch.nn.Module:
    """A reward model: the policy's backbone with a fresh scalar head read at the last non-pad token."""
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(policy_path), num_labels=1, dtype=torch.float32
    )
    torch.nn.init.normal_(model.score.weight, std=1.0 / (model.config.hidden_size + 1) ** 0.5)
    return model


def save_hf(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> None:
    """Write model + tokenizer as a Hugging Face directory (safetensors)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def set_threads() -> None:
    """Use the cores we have; torch's default can oversubscribe a 2-core machine under Prefect threads."""
    n = int(os.environ.get("RLHF_TORCH_THREADS", "0")) or max(1, os.cpu_count() or 1)
    torch.set_num_threads(n)
