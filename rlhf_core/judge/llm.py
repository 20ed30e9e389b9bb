"""What every LLM judge shares: the judging and grading prompts, their parsing, the cache and usage counters.

A backend (HTTP API, local transformers model) only implements `_complete(messages) -> reply text`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from rlhf_core.judge.cache import JudgementCache, grade_key, judgement_key
from rlhf_core.judge.grading import Grade
from rlhf_core.judge.prompt import grading_messages, judging_messages, parse_rating, parse_verdict
from rlhf_core.judge.protocol import Judgement

T = TypeVar("T", Judgement, Grade)


def limits_key(limits: dict[str, int], defaults: dict[str, int]) -> str:
    """'name=value,...' of the limits that differ from their defaults ('' when none does)."""
    return ",".join(f"{k}={v}" for k, v in sorted(limits.items()) if v != defaults[k])


class MalformedReply(ValueError):
    """The backend answered, but with no reply text to parse (recorded as an unparsed judgement)."""


class LLMJudge:
    """compare/judgement/grade over `_complete`; counters in `usage`: requests (sent, retries included),
    retries, cache_hits, replies (fresh judgements and grades), prompt_tokens, completion_tokens, unparsed,
    fallback. `grading_criteria` (a grading_criteria_text) is needed only to grade."""

    kind = "llm"

    def __init__(self, model: str, criteria: str, template_version: str, cache: JudgementCache | None = None,
                 grading_criteria: str | None = None, grading_template_version: str = "single-v1"):
        self.model = model
        self.criteria = criteria  # the criteria sentence itself: a custom text is part of the cache key
        self.template_version = template_version
        self.cache = cache
        self.grading_criteria = grading_criteria
        self.grading_template_version = grading_template_version
        self.usage: Counter[str] = Counter()
        self._usage_lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}  # one per cache key: a pair in flight is asked once
        self.reply_limits = ""  # a subclass's limits that differ from its defaults (`limits_key`): cached apart

    def key_model(self) -> str:
        """The model as the cache keys see it: with the reply limits where they are not the defaults, since a reply
        cut short is a different (often unparsed) judgement. The defaults add nothing, so caches written before the
        limits were keyed still serve them."""
        return f"{self.model}|{self.reply_limits}" if self.reply_limits else self.model

    def _complete(self, messages: list[dict[str, str]]) -> str:
        raise NotImplementedError

    def count(self, **amounts: int) -> None:
        with self._usage_lock:
            self.usage.update(amounts)

    def judgement(self, prompt: str, first: str, second: str) -> Judgement:
        """The cached judgement of (prompt, first, second) in this order, else a fresh one (then cached)."""
        key = judgement_key(self.kind, self.key_model(), self.template_version, self.criteria, prompt, first,
                            second)
        with self._key_lock(key):  # a second thread with the same pair waits, then finds it cached
            cached = _reread(self.cache.get(key) if self.cache is not None else None, _judgement_from_reply)
            if cached is not None:
                self.count(cache_hits=1)
                return cached
            judgement, whole = self._ask(judging_messages(prompt, first, second, self.criteria,
                                                          self.template_version),
                                         _judgement_from_reply, lambda why: Judgement("tie", "", "unparsed", why))
            if self.cache is not None and whole:
                self.cache.put(key, judgement)
            return judgement

    def grade(self, prompt: str, answer: str) -> Grade:
        """The cached 1-10 grade of `answer` alone, else a fresh one (then cached); NaN when unparsed."""
        if self.grading_criteria is None:
            raise ValueError(f"{type(self).__name__} was built without grading_criteria: it cannot grade")
        key = grade_key(self.kind, self.key_model(), self.grading_template_version, self.grading_criteria, prompt,
                        answer)
        with self._key_lock(key):
            cached = _reread(self.cache.get_grade(key) if self.cache is not None else None, _grade_from_reply)
            if cached is not None:
                self.count(cache_hits=1)
                return cached
            grade, whole = self._ask(grading_messages(prompt, answer, self.grading_criteria,
                                                      self.grading_template_version),
                                     _grade_from_reply, lambda why: Grade(float("nan"), "", "unparsed", why))
            if self.cache is not None and whole:
                self.cache.put_grade(key, grade)
            return grade

    def _key_lock(self, key: str) -> threading.Lock:
        with self._usage_lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _ask(self, messages: list[dict[str, str]], from_reply: Callable[[str], T],
             from_malformed: Callable[[str], T]) -> tuple[T, bool]:
        """A fresh reply to `messages`, parsed, counted by status, and whether a reply came whole. A malformed one
        (no reply text, after the backend's retries) gives `from_malformed(reason)`, which is not to be cached: a
        re-run asks again rather than keep an outage's tie for good."""
        try:
            result, whole = from_reply(self._complete(messages)), True
        except MalformedReply as e:
            result, whole = from_malformed(str(e)), False
        self.count(replies=1, **({result.parse_status: 1} if result.parse_status != "ok" else {}))
        return result, whole

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        judgement = self.judgement(prompt, first, second)
        return judgement.outcome, judgement.rationale


def _reread(cached: T | None, from_reply: Callable[[str], T]) -> T | None:
    """A cached judgement or grade as today's parser reads its reply (the reply is kept: a parser fix applies to
    replies paid for before); None, to ask again, for one cached with no reply at all (a malformed answer, which
    caches written before 2026-11-29 kept)."""
    if cached is None or cached.parse_status == "ok":
        return cached
    return from_reply(cached.rationale) if cached.rationale else None


def _judgement_from_reply(reply: str) -> Judgement:
    parsed = parse_verdict(reply)
    return Judgement(parsed.outcome, reply.strip(), parsed.status, parsed.reason)


def _grade_from_reply(reply: str) -> Grade:
    parsed = parse_rating(reply)
    return Grade(parsed.rating, reply.strip(), parsed.status, parsed.reason)
