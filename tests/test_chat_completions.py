"""The shared chat-completions client's pieces that the tagger and judge tests do not reach."""

from __future__ import annotations

import httpx
import pytest
from judge_server import COMPLETION_TOKENS, PROMPT_TOKENS, JudgeServer

from rlhf_core.chat_completions import (
    ChatCompletionsClient,
    ChatCompletionsError,
    MalformedCompletion,
    checked_key,
    retry_after_s,
    scrub,
    server_message,
)

KEY = "sk-test-0a1b2c3d-never-log-me"


@pytest.mark.parametrize(
    "header, seconds",
    [
        ("2.5", 2.5),
        ("120", 30.0),  # capped at MAX_RETRY_AFTER_S
        ("-1", 0.0),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),  # the HTTP-date form is ignored: the backoff applies
    ],
)
def test_retry_after_in_seconds_is_capped_and_a_date_is_ignored(header, seconds):
    assert retry_after_s(httpx.Response(429, headers={"Retry-After": header})) == seconds


def test_no_retry_after_header_means_none():
    assert retry_after_s(httpx.Response(503)) is None


def test_server_message_is_the_openai_error_message_else_the_body():
    assert server_message(httpx.Response(401, json={"error": {"message": "Incorrect API key"}})) == "Incorrect API key"
    assert server_message(httpx.Response(400, json={"error": "bad model"})) == "bad model"
    assert server_message(httpx.Response(502, text="<html>bad gateway</html>")) == "<html>bad gateway</html>"
    assert server_message(httpx.Response(502, text="x" * 600)) == "x" * 500


def test_scrub_replaces_the_key_and_leaves_text_alone_without_one():
    assert scrub(f"you sent Bearer {KEY}", KEY) == "you sent Bearer ***"
    assert scrub("no key here", None) == "no key here"


def test_a_key_with_a_line_break_around_it_is_sent_stripped_and_one_inside_it_is_refused_unshown():
    """A Secret block or .env line ending in a line break: httpx would refuse the header and quote it escaped, where
    `scrub` cannot find the key."""
    assert checked_key(KEY + "\r\n") == KEY and checked_key(None) is None
    with JudgeServer() as server, ChatCompletionsClient(server.base_url, "m", f" {KEY}\n") as client:
        server.always = "hello"
        assert client.complete([{"role": "user", "content": "hi"}]).content == "hello"
        assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    for bad in (KEY[:8] + "\n" + KEY[8:], "\n", KEY + "\x7f"):
        with pytest.raises(ValueError, match="character an HTTP header cannot carry") as err:
            ChatCompletionsClient("http://127.0.0.1:1/v1", "m", bad)
        assert KEY[:8] not in str(err.value)


def test_a_key_cut_by_the_quoted_body_start_is_still_scrubbed():
    # '{"detail": "' is 12 characters, so the key starts at 115: a quote cut at 120 would keep "sk-te"
    body = {"detail": "x" * 103 + KEY}
    with JudgeServer() as server, ChatCompletionsClient(server.base_url, "m", KEY, max_retries=0) as client:
        server.script = [("body", body)]
        with pytest.raises(MalformedCompletion, match="malformed response body") as err:
            client.complete([{"role": "user", "content": "hi"}])
    assert KEY[:5] not in str(err.value) and KEY[:5] not in err.value.body and "***" in err.value.body


def test_a_key_that_a_server_error_quotes_across_the_messages_cut_is_scrubbed_whole():
    """The error message is cut at 500 characters: cut before the scrub, the key's first 28 characters stayed."""
    with JudgeServer() as server, ChatCompletionsClient(server.base_url, "m", KEY) as client:
        # the server's message echoes the key at characters 487-516 of the 500 kept
        server.script = [("status", 400, {}, "y" * 453)]
        with pytest.raises(ChatCompletionsError, match="HTTP 400") as err:
            client.complete([{"role": "user", "content": "hi"}])
    assert KEY[:5] not in str(err.value) and "***" in str(err.value)


def test_a_key_is_sent_over_https_or_to_this_machine_only():
    for url in ("http://judge.example.com/v1", "http://10.0.0.5:8000/v1", "http://[2001:db8::1]:8000/v1"):
        with pytest.raises(ValueError, match="refusing to send the API key over plain http to another machine"):
            ChatCompletionsClient(url, "m", KEY)
    for url in ("https://api.openai.com/v1", "http://127.0.0.1:8000/v1", "http://localhost:8000/v1",
                "http://[::1]:8000/v1"):
        ChatCompletionsClient(url, "m", KEY).close()
    ChatCompletionsClient("http://judge.example.com/v1", "m", None).close()  # no key: nothing to protect


def test_each_retry_is_logged_and_a_dead_server_is_found_before_a_round_starts(caplog):
    import logging
    import socket

    from rlhf_core.chat_completions import ChatServerUnavailableError, check_chat_server

    with JudgeServer() as server, ChatCompletionsClient(server.base_url, "m", KEY, backoff_s=0.0) as client:
        server.script = [("status", 503, {}), ("reply", "hello")]
        with caplog.at_level(logging.WARNING, logger="rlhf"):
            assert client.complete([{"role": "user", "content": "hi"}]).content == "hello"
        check_chat_server(server.base_url, "evaluation.http.base_url")  # answers (its /models is a 404: fine)
    [retry] = [r.getMessage() for r in caplog.records if r.name == "rlhf"]
    assert "HTTP 503" in retry and "retry 1 of 3" in retry and KEY not in retry and "***" in retry
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ChatServerUnavailableError, match=rf"evaluation.http.base_url: nothing answers at "
                                                         rf"http://127.0.0.1:{port}/v1 \(ConnectError\)"):
        check_chat_server(f"http://127.0.0.1:{port}/v1", "evaluation.http.base_url")


def test_the_count_hook_gets_requests_retries_and_tokens():
    counts: list[dict] = []
    with JudgeServer() as server, ChatCompletionsClient(server.base_url, "m", None, backoff_s=0.0,
                                                        count=lambda **c: counts.append(c)) as client:
        server.script = [("status", 503, {}), ("reply", "hello")]
        reply = client.complete([{"role": "user", "content": "hi"}], max_tokens=7)
        sent = server.requests[-1]
    assert (reply.content, reply.prompt_tokens, reply.completion_tokens) == ("hello", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert counts == [{"requests": 1, "retries": 0}, {"requests": 1, "retries": 1},
                      {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS}]
    assert "Authorization" not in sent["headers"] and sent["body"]["max_tokens"] == 7


def test_a_proxy_of_the_environment_never_gets_a_request_to_this_machine(monkeypatch):
    """http_proxy / ALL_PROXY name another machine: a key allowed over plain http to this one reached the proxy in
    clear text (httpx does not skip loopback by itself). https requests still use the proxy (their key is
    encrypted end to end)."""
    from rlhf_core.chat_completions import check_chat_server

    with JudgeServer() as judge, JudgeServer() as proxy:
        judge.always = "hello"
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.base_url.removesuffix("/v1"))
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        with ChatCompletionsClient(judge.base_url, "m", KEY, max_retries=0) as client:
            assert client.complete([{"role": "user", "content": "hi"}]).content == "hello"
        check_chat_server(judge.base_url, "evaluation.http.base_url")
        assert proxy.requests == [] and len(judge.requests) == 1
        assert judge.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
