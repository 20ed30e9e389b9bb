"""A local transformers judge: a causal LM from a local directory asked the same pairwise prompt.

The verdict is parsed from its greedy continuation like an API judge's reply, so a small local
model that drifts from the "[[A]]" format shows up as fallback / unparsed judgements, not as
made-up verdicts. The model is identified in the cache key by the digest of its files.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from rlhf_core.artifacts import content_digest
from rlhf_core.config import LocalJudgeConfig
from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.llm import LLMJudge, limits_key

LOCAL_REPLY_DEFAULTS = {k: LocalJudgeConfig.model_fields[k].default for k in ("max_new_tokens", "max_input_tokens")}


class LocalJudge(LLMJudge):
    kind = "local"

    def __init__(self, model_path: str | Path, criteria: str, template_version: str, *,
                 cache: JudgementCache | None = None,
                 max_new_tokens: int = LOCAL_REPLY_DEFAULTS["max_new_tokens"],
                 max_input_tokens: int = LOCAL_REPLY_DEFAULTS["max_input_tokens"],
                 grading_criteria: str | None = None, grading_template_version: str = "single-v1"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"local judge: {path} holds no model (no config.json): give a local Hugging "
                                    "Face model directory")
        super().__init__(f"{path.name}@{content_digest(path)[0][:16]}", criteria, template_version, cache,
                         grading_criteria, grading_template_version)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True).eval()
        self.max_new_tokens, self.max_input_tokens = max_new_tokens, max_input_tokens
        self.reply_limits = limits_key({"max_new_tokens": max_new_tokens, "max_input_tokens": max_input_tokens},
                                       LOCAL_REPLY_DEFAULTS)
        self._generate_lock = threading.Lock()  # one forward pass at a time: the model is shared

    def prompt_text(self, messages: list[dict[str, str]]) -> str:
        """The tokenizer's chat template if it has one, else the messages as plain paragraphs."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages) + "\n\nExplanation and verdict:"

    @torch.no_grad()
    def _complete(self, messages: list[dict[str, str]]) -> str:
        ids = self.tokenizer(self.prompt_text(messages), return_tensors="pt").input_ids[:, -self.max_input_tokens:]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        with self._generate_lock:
            out = self.lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=self.max_new_tokens, pad_token_id=pad)
        self.count(requests=1, prompt_tokens=ids.shape[1], completion_tokens=out.shape[1] - ids.shape[1])
        return self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
