"""An OpenAI-compatible chat-completions judge (GPT-4, or any vLLM / llama.cpp server).

- Temperature 0; the MT-Bench pairwise prompt (`prompt.py`); the verdict parsed strictly, with fallbacks.
- Requests through `rlhf_core.chat_completions`: retries with exponential backoff on HTTP 429, 5xx,
  connection errors, timeouts and 200 answers without reply text (never cached: a re-run asks again), a
  Retry-After header (seconds) honoured, capped; other 4xx fail at once: a wrong model name or key will not get
  better by asking again.
- The API key is given at construction (the tasks layer reads it from an environment variable or a
  Prefect Secret block); it is kept private, never in repr, a cache entry or an error message.
- Token counts from each reply's `usage`, priced per 1k tokens into `cost_usd`.
"""

from __future__ import annotations

from rlhf_core.chat_completions import ChatCompletionsClient, ChatCompletionsError, MalformedCompletion
from rlhf_core.config import HTTPJudgeConfig
from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.llm import LLMJudge, MalformedReply, limits_key

OPENAI_CHAT_URL = "https://api.openai.com/v1/chat/completions"
HTTP_REPLY_DEFAULTS = {"max_tokens": HTTPJudgeConfig.model_fields["max_tokens"].default}


class JudgeError(RuntimeError):
    """The judging endpoint failed for good (after retries, or with a non-retryable status)."""


class HTTPJudge(LLMJudge):
    kind = "http"

    def __init__(self, base_url: str, model: str, criteria: str, template_version: str, *,
                 api_key: str | None = None, cache: JudgementCache | None = None, timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 1.0, max_tokens: int = HTTP_REPLY_DEFAULTS["max_tokens"],
                 price_input_per_1k: float = 0.0, price_output_per_1k: float = 0.0,
                 grading_criteria: str | None = None, grading_template_version: str = "single-v1"):
        super().__init__(model, criteria, template_version, cache, grading_criteria, grading_template_version)
        self._chat = ChatCompletionsClient(base_url, model, api_key, timeout_s=timeout_s, max_retries=max_retries,
                                           backoff_s=backoff_s, count=self.count)
        self.url = self._chat.url
        self.max_tokens = max_tokens
        self.reply_limits = limits_key({"max_tokens": max_tokens}, HTTP_REPLY_DEFAULTS)
        self.prices = (price_input_per_1k, price_output_per_1k)

    def key_model(self) -> str:
        """The cache's model with the endpoint: two servers answering to one model name (llama.cpp ignores it)
        judge differently. OpenAI's own endpoint adds nothing, so its caches written before still serve."""
        model = super().key_model()
        return model if self.url == OPENAI_CHAT_URL else f"{model}@{self.url}"

    def __repr__(self) -> str:
        return f"HTTPJudge(url={self.url!r}, model={self.model!r}, template={self.template_version!r})"

    def close(self) -> None:
        self._chat.close()
        super().close()

    @property
    def cost_usd(self) -> float:
        """Σ prompt tokens / 1000 × input price + Σ completion tokens / 1000 × output price."""
        return (self.usage["prompt_tokens"] * self.prices[0] + self.usage["completion_tokens"] * self.prices[1]) / 1000

    def _complete(self, messages: list[dict[str, str]]) -> str:
        """The reply text (key scrubbed); the client counts requests, retries and tokens into `usage`."""
        try:
            return self._chat.complete(messages, max_tokens=self.max_tokens).content
        except ChatCompletionsError as e:
            raise JudgeError(str(e)) from None
        except MalformedCompletion as e:
            raise MalformedReply(str(e)) from None
