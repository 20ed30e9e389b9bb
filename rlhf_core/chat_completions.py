"""A client for OpenAI-compatible `POST {base_url}/chat/completions` endpoints (OpenAI, vLLM, llama.cpp).

Shared by the LLM tagger (`sampling/taggers.py`) and the HTTP judge (`judge/http.py`); each keeps
its own prompting, parsing and caching.

- The API key goes out as `Authorization: Bearer <key>` (no header when there is none), over https or to this
  machine only (plain http to another host is refused). It is kept private, never in repr, and scrubbed ("***")
  from every error message and reply text, in case a server echoes it.
- Retries on I/O only: HTTP 429, 5xx, connection errors and timeouts, and a 200 answer without reply text (a
  proxy's error page, a cut-off body), with exponential backoff (backoff_s, 2 × backoff_s, ...); a Retry-After
  header in seconds replaces the backoff, capped at MAX_RETRY_AFTER_S. Other 4xx fail at once: a wrong model name or key will not get better by asking again.
- Error messages quote the server's own message (error.message of an OpenAI-style body).
- Each 200 reply's `usage` gives its prompt and completion token counts.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

MAX_RETRY_AFTER_S = 30.0  # a server's Retry-After is respected up to this many seconds
log = logging.getLogger("rlhf")


class ChatCompletionsError(RuntimeError):
    """The endpoint failed for good (after retries, or with a non-retryable status)."""


class ChatServerUnavailableError(RuntimeError):
    """A configured chat-completions server does not answer at all; raised before a round starts."""


def check_chat_server(base_url: str, key: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds when nothing answers at `base_url` (`key`: its config key, for the message). Any HTTP answer
    counts, 401 and 404 included: this asks whether a server is there, not whether it will accept the round's
    requests (a round found a dead judge only at its last stage, after retrying it for half a minute)."""
    try:
        httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout_s,
                  trust_env=not _plain_http_to_this_machine(base_url))  # as the client: no proxy to this machine
    except httpx.TransportError as err:
        raise ChatServerUnavailableError(
            f"{key}: nothing answers at {base_url} ({type(err).__name__}): start the server, or fix the URL") from None


class MalformedCompletion(ValueError):
    """A 200 answer with no message text in it; `body` is the start of the answer, key scrubbed."""

    def __init__(self, message: str, body: str):
        super().__init__(message)
        self.body = body


@dataclass(frozen=True)
class ChatReply:
    """The message text of one completion (key scrubbed) and its token counts from `usage`."""

    content: str
    prompt_tokens: int
    completion_tokens: int


def server_message(response: httpx.Response, secret: str | None = None) -> str:
    """The server's error message: error.message of an OpenAI-style body, else the body's start; the key scrubbed
    before the cut (a cut through an echoed key would leave its start where `scrub` no longer finds it)."""
    try:
        body = response.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message", err) if isinstance(err, dict) else err
        return scrub(str(msg), secret)[:500]
    except ValueError:
        return scrub(response.text, secret)[:500]


def scrub(text: str, secret: str | None) -> str:
    """Remove the key from a message, in case a server or library echoes it."""
    return text.replace(secret, "***") if secret else text


def checked_key(api_key: str | None) -> str | None:
    """The key without the whitespace around it (a Secret block or .env line often ends in a line break). A key
    with a control character left inside is refused here, unsent and unshown: httpx would quote the header back
    in its error with the bytes escaped, where `scrub` cannot find the key."""
    if api_key is None:
        return None
    if not isinstance(api_key, str):
        raise ValueError(f"the API key is a {type(api_key).__name__}, not text (a Secret block holding a JSON "
                         "object?): store the key itself (its value is not shown)")
    key = api_key.strip()
    # printable ASCII only: a byte-order mark or a zero-width space failed inside httpx with an error that
    # holds the whole header, key included, and Prefect logs a failed task's exception as it is
    if not key or not (key.isascii() and key.isprintable()):
        raise ValueError("the API key is empty or holds a character an HTTP header cannot carry (a line break, a "
                         "byte-order mark or an invisible space pasted with it?): fix the environment variable or "
                         "Secret block that holds it (its value is not shown)")
    return key


def key_for(url: str, api_key: str | None) -> str | None:
    """`checked_key(api_key)`, refused for a `url` it may not go to (plain http to another machine). The client's
    check before it sends anything; a round makes it before its first stage too (`flows.round.check_chat_servers`)."""
    key = checked_key(api_key)
    if key and not encrypted_or_local(url):
        raise ValueError(f"{url}: refusing to send the API key over plain http to another machine (anyone on the way "
                         "could read it): use https, or set api_key_env to null for a server that needs no key (a "
                         "vLLM or llama.cpp server)")
    return key


def encrypted_or_local(url: str) -> bool:
    """https, or http to this machine (a loopback address): where an API key may be sent."""
    return httpx.URL(url).scheme == "https" or _plain_http_to_this_machine(url)


def _plain_http_to_this_machine(url: str) -> bool:
    parts = httpx.URL(url)
    if parts.scheme != "http":
        return False
    host = parts.host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After in seconds (the HTTP-date form is ignored), clamped to [0, MAX_RETRY_AFTER_S]."""
    try:
        seconds = float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if math.isfinite(seconds) else None  # "nan" parses


def _no_count(**amounts: int) -> None:
    pass


class ChatCompletionsClient:
    """POSTs chat completions to `{base_url}/chat/completions`, retrying on I/O as the module says.

    `count` is called with requests=1 and retries=0 or 1 before every request sent, and with
    prompt_tokens and completion_tokens for every 200 answer (the judge's usage counters take it as is).
    Safe to share between threads (one httpx.Client); close it, or use it as a context manager.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = 60.0,
                 max_retries: int = 3, backoff_s: float = 1.0, count: Callable[..., None] = _no_count):
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError("max_retries must be >= 0 and timeout_s > 0")
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.model = model
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._api_key = key_for(self.url, api_key)
        self._count = count
        # a proxy of the environment (http_proxy, ALL_PROXY) is another machine: plain http to this one goes direct,
        # else the key allowed there would reach the proxy in clear text (httpx does not skip loopback by itself)
        self._client = httpx.Client(timeout=timeout_s, trust_env=not _plain_http_to_this_machine(self.url))

    def __repr__(self) -> str:
        return f"ChatCompletionsClient(url={self.url!r}, model={self.model!r}, max_retries={self.max_retries})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ChatCompletionsClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def complete(self, messages: list[dict[str, str]], *, temperature: float = 0,
                 max_tokens: int | None = None) -> ChatReply:
        """One completion of `messages`; raises ChatCompletionsError, or MalformedCompletion when the last attempt's
        200 answer held no reply text (a proxy's error page or a cut-off body: retried like a 5xx)."""
        payload = {"model": self.model, "messages": messages, "temperature": temperature}
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        for attempt in range(self.max_retries + 1):
            self._count(requests=1, retries=int(attempt > 0))
            wait = self.backoff_s * 2**attempt
            malformed = None
            try:
                response = self._client.post(self.url, json=payload, headers=headers)
            except httpx.TransportError as e:  # connection errors and timeouts
                failure = f"{type(e).__name__}: {e}"
            except Exception as e:  # anything else may hold the request, key included: named, never shown
                raise ChatCompletionsError(f"{self.url}: {type(e).__name__} while sending the request (not "
                                           "retried; its message is not shown, as it may hold the API key)") from None
            else:
                if response.status_code == 200:
                    try:
                        return self._reply(response)
                    except MalformedCompletion as e:  # retried: the next answer may be whole
                        malformed, failure = e, str(e)
                else:
                    failure = f"HTTP {response.status_code}: {server_message(response, self._api_key)}"
                    if response.status_code != 429 and response.status_code < 500:
                        raise ChatCompletionsError(scrub(f"{self.url}: {failure} (not retried)", self._api_key))
                    retry_after = retry_after_s(response)
                    wait = wait if retry_after is None else retry_after
            if attempt < self.max_retries:  # said, so a dead server is not minutes of silence
                log.warning("%s: %s; retry %d of %d in %.1f s", self.url, scrub(failure, self._api_key), attempt + 1,
                            self.max_retries, wait)
                time.sleep(wait)
        if malformed is not None:
            raise malformed
        raise ChatCompletionsError(
            scrub(f"{self.url}: gave up after {self.max_retries + 1} attempts: {failure}", self._api_key))

    def _reply(self, response: httpx.Response) -> ChatReply:
        """The message text and token counts of a 200 answer; counts its tokens; no text is a MalformedCompletion."""
        body_start = scrub(response.text, self._api_key)[:200]  # scrubbed whole: a cut could split the key
        try:
            body = response.json()
            usage = body.get("usage") or {}
            tokens = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
            self._count(prompt_tokens=tokens[0], completion_tokens=tokens[1])
            content = body["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise MalformedCompletion(f"malformed response body: {body_start[:120]!r}", body_start) from None
        if not isinstance(content, str):
            raise MalformedCompletion(f"reply content is {type(content).__name__}, not text", body_start)
        return ChatReply(scrub(content, self._api_key), *tokens)
