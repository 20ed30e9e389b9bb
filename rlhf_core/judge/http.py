"""An OpenAI-compatible chat-completions judge (GPT-4, or any vLLM / llama.cpp server).

- Temperature 0; the MT-Bench pairwise prompt (`prompt.py`); the verdict parsed strictly, with fallbacks.
- Retries with exponential backoff on HTTP 429, 5xx, connection errors and timeouts; a Retry-After
  header (seconds) is honoured, capped. Other 4xx fail at once: a wrong model name or key will not
  get better by asking again.
- The API key is given at construction (the tasks layer reads it from an environment variable or a
  Prefect Secret block); it is kept private, never in repr, a cache entry or an error message.
- Token counts from each reply's `usage`, priced per 1k tokens into `cost_usd`.
"""

from __future__ import annotations

import time

import httpx

from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.llm import LLMJudge, MalformedReply
# the tagger's OpenAI-compatible client helpers: one reading of Retry-After, server errors and scrubbing
from rlhf_core.sampling.taggers import _retry_after, _scrub, _server_message


class JudgeError(RuntimeError):
    """The judging endpoint failed for good (after retries, or with a non-retryable status)."""


class HTTPJudge(LLMJudge):
    kind = "http"

    def __init__(self, base_url: str, model: str, criteria: str, template_version: str, *,
                 api_key: str | None = None, cache: JudgementCache | None = None, timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 1.0, max_tokens: int = 1024,
                 price_input_per_1k: float = 0.0, price_output_per_1k: float = 0.0):
        super().__init__(model, criteria, template_version, cache)
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError("max_retries must be >= 0 and timeout_s > 0")
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.max_retries, self.backoff_s, self.max_tokens = max_retries, backoff_s, max_tokens
        self.prices = (price_input_per_1k, price_output_per_1k)
        self._api_key = api_key
        self._client = httpx.Client(timeout=timeout_s)

    def __repr__(self) -> str:
        return f"HTTPJudge(url={self.url!r}, model={self.model!r}, template={self.template_version!r})"

    def close(self) -> None:
        self._client.close()
        super().close()

    @property
    def cost_usd(self) -> float:
        """Σ prompt tokens / 1000 × input price + Σ completion tokens / 1000 × output price."""
        return (self.usage["prompt_tokens"] * self.prices[0] + self.usage["completion_tokens"] * self.prices[1]) / 1000

    def _complete(self, messages: list[dict[str, str]]) -> str:
        payload = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        for attempt in range(self.max_retries + 1):
            self.count(requests=1, retries=int(attempt > 0))
            wait = self.backoff_s * 2**attempt
            try:
                response = self._client.post(self.url, json=payload, headers=headers)
            except httpx.TransportError as e:  # connection errors and timeouts
                failure = f"{type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    return self._reply_text(response)
                failure = f"HTTP {response.status_code}: {_server_message(response)}"
                if response.status_code != 429 and response.status_code < 500:
                    raise JudgeError(_scrub(f"{self.url}: {failure} (not retried)", self._api_key))
                retry_after = _retry_after(response)
                wait = wait if retry_after is None else retry_after
            if attempt < self.max_retries:
                time.sleep(wait)
        raise JudgeError(_scrub(f"{self.url}: gave up after {self.max_retries + 1} attempts: {failure}",
                                self._api_key))

    def _reply_text(self, response: httpx.Response) -> str:
        """The message content of a 200 answer, counting its tokens; no content is a MalformedReply."""
        try:
            body = response.json()
            usage = body.get("usage") or {}
            self.count(prompt_tokens=int(usage.get("prompt_tokens", 0)),
                       completion_tokens=int(usage.get("completion_tokens", 0)))
            content = body["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise MalformedReply(_scrub(f"malformed response body: {response.text[:120]!r}", self._api_key)) from None
        if not isinstance(content, str):
            raise MalformedReply(f"reply content is {type(content).__name__}, not text")
        return _scrub(content, self._api_key)
