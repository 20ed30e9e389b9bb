"""LLM tagger for the sampling stage: an LLM gives each prompt fine-grained intent/skill tags.

InsTag (Lu et al. 2023) and the Qwen report tag every prompt with an LLM, open-set, then
normalise the tags (`normalize.py`) and select with them (`instag.py`). This module does the
first step against any OpenAI-compatible `POST {base_url}/chat/completions` endpoint, through
`rlhf_core.chat_completions` (bearer key, timeouts, retries on 429/5xx/connection errors with
backoff and Retry-After, key scrubbed from errors).

- The API key is read from the environment at call time and never stored, logged, cached or
  put into an exception message.
- An answer with no parsable tags is asked again once (models sometimes ramble), then raises.
- A JSONL cache keyed by sha256(model, system prompt version, prompt) means re-runs pay only
  for prompts not yet tagged; a truncated last line from a killed run is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from rlhf_core.chat_completions import ChatCompletionsClient, ChatCompletionsError, MalformedCompletion
from rlhf_core.config import ENV_VAR_NAME

PROMPT_VERSION = "instag-v1"  # part of the cache key: change it whenever SYSTEM_PROMPT changes
SYSTEM_PROMPT = (
    "You are a tagging system for user queries to an AI assistant. Give fine-grained tags for "
    "the intentions and skills the query requires (InsTag style), e.g. \"python programming\", "
    "\"data visualization\", \"creative writing\", \"math reasoning\", \"translation\". "
    "Each tag is a short lower-case phrase of a few words. "
    'Answer with a JSON object only: {"tags": ["tag one", "tag two"]}'
)
MAX_TAG_CHARS = 64  # longer "tags" are sentences the model wrote, not tags
# The cache keeps up to this many of a prompt's tags and `max_tags` trims on reading, so a changed max_tags applies
# to cached prompts too (the prompt to the model does not depend on it, so the key does not either)
CACHED_MAX_TAGS = 32

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


# ---------------------------------------------------------------- parsing


def _tag_list(value) -> list | None:
    """The tag list inside one decoded JSON value: {"tags": [...]} or a bare list; else None."""
    if isinstance(value, dict):
        value = value.get("tags")
    return value if isinstance(value, list) else None


def _json_candidates(text: str):
    """Decoded JSON values in the order tried: whole text, ```json fences, then embedded in prose."""
    decoder = json.JSONDecoder()
    for chunk in [text, *_FENCE.findall(text)]:
        try:
            yield json.loads(chunk)
        except ValueError:
            pass
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                yield decoder.raw_decode(text, i)[0]
            except ValueError:
                pass


def clean_tags(raw: list, max_tags: int = 8) -> list[str]:
    """Strip, lower-case and dedupe (first spelling wins); drop empty, non-string, overlong tags."""
    seen: dict[str, None] = {}
    for t in raw:
        if not isinstance(t, str):
            continue
        t = " ".join(t.split()).lower()
        if t and len(t) <= MAX_TAG_CHARS:
            seen.setdefault(t, None)
    return list(seen)[:max_tags]


def parse_tags(text: str, max_tags: int = 8) -> list[str]:
    """Tags from a model answer: JSON {"tags": [...]}, a bare list, a ```json fence, or JSON in prose.

    The first JSON value that holds at least one usable tag wins. Raises ValueError when none does.
    """
    for value in _json_candidates(text):
        raw = _tag_list(value)
        if raw is not None:
            tags = clean_tags(raw, max_tags)
            if tags:
                return tags
    raise ValueError(f"no tags in model output: {text[:200]!r}")


# ---------------------------------------------------------------- cache


def cache_key(model: str, prompt: str, prompt_version: str = PROMPT_VERSION) -> str:
    """sha256 of model, system prompt version and prompt text, NUL-separated."""
    return hashlib.sha256(f"{model}\0{prompt_version}\0{prompt}".encode()).hexdigest()


def load_cache(path: Path) -> tuple[dict[str, list[str]], bool]:
    """Entries of a JSONL tag cache, and whether the file ends mid-line (a killed run).

    Lines that do not parse (a truncated last line) are skipped.
    """
    if not path.exists():
        return {}, False
    data = path.read_bytes()
    entries: dict[str, list[str]] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
            key, tags = row["key"], row["tags"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(key, str) and isinstance(tags, list):
            entries[key] = [str(t) for t in tags]
    return entries, bool(data) and not data.endswith(b"\n")


# ---------------------------------------------------------------- errors


class TaggerError(RuntimeError):
    """The tagging endpoint failed for good (after retries, or with a non-retryable status)."""


ENV_NAME = re.compile(ENV_VAR_NAME)


# ---------------------------------------------------------------- tagger


class LLMTagger:
    """Tags prompts with an OpenAI-compatible chat endpoint; counters `calls`, `cache_hits`, `retries`.

    `calls` counts HTTP requests sent (retries included), `retries` the re-sent ones (I/O and
    parse retries), `cache_hits` the prompts answered from the cache.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        cache_path: str | Path | None = None,
        max_retries: int = 3,
        timeout_s: float = 60.0,
        backoff_s: float = 1.0,
        max_tags: int = 8,
    ):
        if max_retries < 0 or max_tags < 1:
            raise ValueError("max_retries must be >= 0 and max_tags >= 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env  # the variable's name only; the key itself is never kept
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_tags = max_tags
        self.calls = 0
        self.cache_hits = 0
        self.retries = 0
        self._cache: dict[str, list[str]] = {}
        self._cache_ends_midline = False
        if self.cache_path is not None:
            self._cache, self._cache_ends_midline = load_cache(self.cache_path)

    def __repr__(self) -> str:
        return (
            f"LLMTagger(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self._shown_key_env()!r}, cache_path={self.cache_path!r}, "
            f"max_retries={self.max_retries}, max_tags={self.max_tags})"
        )

    def _shown_key_env(self) -> str | None:
        """api_key_env as a repr may show it: a value that is no variable name may be a pasted key."""
        if self.api_key_env is None or ENV_NAME.fullmatch(self.api_key_env):
            return self.api_key_env
        return "<not a variable name: not shown>"

    def api_key(self) -> str | None:
        """The key from the environment, read at call time; None when no key is used."""
        if self.api_key_env is None:
            return None
        if not ENV_NAME.fullmatch(self.api_key_env):  # a key pasted where its variable's name belongs
            raise TaggerError("api_key_env must be the NAME of an environment variable (upper-case letters, "
                              "digits, _), not the key itself: export the key, e.g. OPENAI_API_KEY=..., and give "
                              "that name")
        key = os.environ.get(self.api_key_env)
        if not key:
            raise TaggerError(
                f"environment variable {self.api_key_env} is not set: it must hold the API key "
                "(or pass api_key_env=None for a server that needs none)"
            )
        return key

    def _append_cache(self, key: str, tags: list[str]) -> None:
        """Append one entry, flushed and fsynced, so a killed run loses at most the line it was writing."""
        self._cache[key] = tags
        if self.cache_path is None:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": key, "tags": tags}) + "\n"
        if self._cache_ends_midline:  # never glue a new entry onto a truncated line
            line = "\n" + line
            self._cache_ends_midline = False
        with open(self.cache_path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def _count(self, requests: int = 0, retries: int = 0, **tokens: int) -> None:
        """The chat client's counting hook: requests sent and re-sent (token counts are not kept)."""
        self.calls += requests
        self.retries += retries

    def _post(self, client: ChatCompletionsClient, prompt: str) -> str:
        """One chat completion's content; a malformed answer counts as unparsable output."""
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        try:
            return client.complete(messages).content
        except ChatCompletionsError as e:
            raise TaggerError(str(e)) from None
        except MalformedCompletion as e:
            raise ValueError(f"no tags in model output: {e.body!r}") from None

    def _tag_one(self, client: ChatCompletionsClient, prompt: str) -> list[str]:
        """Tags of one prompt from the API; an unparsable answer is asked again once."""
        for attempt in range(2):
            if attempt:
                self.retries += 1
            try:  # the client scrubbed the key from the answer these errors quote
                return parse_tags(self._post(client, prompt), CACHED_MAX_TAGS)
            except ValueError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def tag(self, prompts: list[str], progress: bool = False) -> list[list[str]]:
        """Tags for every prompt, in order: from the cache first, the API only for misses."""
        keys = [cache_key(self.model, p) for p in prompts]
        misses = {k: p for k, p in zip(keys, prompts) if k not in self._cache}
        self.cache_hits += len(prompts) - sum(1 for k in keys if k in misses)
        if misses:
            api_key = self.api_key()
            with ChatCompletionsClient(self.base_url, self.model, api_key, timeout_s=self.timeout_s,
                                       max_retries=self.max_retries, backoff_s=self.backoff_s,
                                       count=self._count) as client:
                for i, (k, prompt) in enumerate(misses.items(), 1):
                    self._append_cache(k, self._tag_one(client, prompt))
                    if progress:
                        print(f"tagged {i}/{len(misses)} prompts", file=sys.stderr)
        return [list(self._cache[k])[:self.max_tags] for k in keys]
