"""What every LLM judge shares: the judging prompt, verdict parsing, the cache and usage counters.

A backend (HTTP API, local transformers model) only implements `_complete(messages) -> reply text`.
"""

from __future__ import annotations

import threading
from collections import Counter

from rlhf_core.judge.cache import JudgementCache, judgement_key
from rlhf_core.judge.prompt import judging_messages, parse_verdict
from rlhf_core.judge.protocol import Judgement


class MalformedReply(ValueError):
    """The backend answered, but with no reply text to parse (recorded as an unparsed judgement)."""


class LLMJudge:
    """compare/judgement over `_complete`; counters in `usage`: requests (sent, retries included), retries,
    cache_hits, replies (fresh judgements), prompt_tokens, completion_tokens, unparsed, fallback."""

    kind = "llm"

    def __init__(self, model: str, criteria: str, template_version: str, cache: JudgementCache | None = None):
        self.model = model
        self.criteria = criteria  # the criteria sentence itself: a custom text is part of the cache key
        self.template_version = template_version
        self.cache = cache
        self.usage: Counter[str] = Counter()
        self._usage_lock = threading.Lock()

    def _complete(self, messages: list[dict[str, str]]) -> str:
        raise NotImplementedError

    def count(self, **amounts: int) -> None:
        with self._usage_lock:
            self.usage.update(amounts)

    def judgement(self, prompt: str, first: str, second: str) -> Judgement:
        """The cached judgement of (prompt, first, second) in this order, else a fresh one (then cached)."""
        key = judgement_key(self.kind, self.model, self.template_version, self.criteria, prompt, first, second)
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None:
            self.count(cache_hits=1)
            return cached
        messages = judging_messages(prompt, first, second, self.criteria, self.template_version)
        try:
            reply = self._complete(messages)
        except MalformedReply as e:
            judgement = Judgement("tie", "", "unparsed", str(e))
        else:
            parsed = parse_verdict(reply)
            judgement = Judgement(parsed.outcome, reply.strip(), parsed.status, parsed.reason)
        self.count(replies=1, **({judgement.parse_status: 1} if judgement.parse_status != "ok" else {}))
        if self.cache is not None:
            self.cache.put(key, judgement)
        return judgement

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        judgement = self.judgement(prompt, first, second)
        return judgement.outcome, judgement.rationale
