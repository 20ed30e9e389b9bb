"""LLMTagger against a real local HTTP server emulating POST /chat/completions."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlhf_core.sampling.taggers import LLMTagger, TaggerError, cache_key, parse_tags

KEY = "sk-test-SECRET-0123456789"
TAGS = {"sort a list in python": ["python programming", "sorting"], "write a haiku": ["poetry"]}


def _tags_for(prompt: str) -> list[str]:
    return TAGS.get(prompt, [f"tag {len(prompt)}"])


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body: dict | str, headers: dict | None = None):
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests += 1
            srv.auth.append(self.headers.get("Authorization"))
            fail = srv.fail_first > 0
            srv.fail_first -= fail
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "no such route"}})
        if srv.mode == "401":
            return self._send(401, {"error": {"message": "Incorrect API key provided"}})
        if fail:
            return self._send(srv.fail_status, {"error": {"message": "overloaded"}}, srv.fail_headers)
        if srv.mode == "echo_body":  # a 200 whose body is not a completion and echoes the request header
            return self._send(200, f"bad gateway page; you sent {self.headers.get('Authorization')}")
        if srv.mode == "echo_content":  # a completion whose content (no tags in it) echoes the header
            return self._send(200, {"choices": [{"message": {"content": f"hello {self.headers.get('Authorization')}"}}]})
        prompt = body["messages"][-1]["content"]
        content = json.dumps({"tags": _tags_for(prompt)})
        if srv.mode == "prose":
            content = f"Sure! Here are the tags:\n```json\n{content}\n```\nHope this helps."
        elif srv.mode == "ramble" or (srv.mode == "ramble_once" and srv.requests == 1):
            content = "Let me think about what this prompt is about..."
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.lock = threading.Lock()
    srv.requests, srv.auth, srv.mode = 0, [], "ok"
    srv.fail_first, srv.fail_status, srv.fail_headers = 0, 503, {}
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("TAGGER_TEST_KEY", KEY)
    return KEY


def _tagger(server, tmp_path, **kw) -> LLMTagger:
    kw = {"api_key_env": "TAGGER_TEST_KEY", "cache_path": tmp_path / "tags.jsonl", "backoff_s": 0.01, **kw}
    return LLMTagger(server.base_url, "test-model", **kw)


PROMPTS = ["sort a list in python", "write a haiku", "explain GAE"]
EXPECTED = [["python programming", "sorting"], ["poetry"], ["tag 11"]]


def test_tags_parsed_and_key_sent_as_bearer(server, tmp_path, key):
    tagger = _tagger(server, tmp_path)
    assert tagger.tag(PROMPTS) == EXPECTED
    assert (tagger.calls, tagger.cache_hits, tagger.retries) == (3, 0, 0)
    assert server.auth == [f"Bearer {key}"] * 3


def test_second_instance_reads_cache_and_makes_no_calls(server, tmp_path, key):
    _tagger(server, tmp_path).tag(PROMPTS)
    again = _tagger(server, tmp_path)
    assert again.tag(PROMPTS) == EXPECTED
    assert (again.calls, again.cache_hits) == (0, len(PROMPTS))
    assert server.requests == len(PROMPTS)


def test_max_tags_applies_to_cached_prompts_lowered_and_raised(server, tmp_path, key):
    assert _tagger(server, tmp_path, max_tags=1).tag(PROMPTS) == [tags[:1] for tags in EXPECTED]
    raised = _tagger(server, tmp_path, max_tags=8)
    assert raised.tag(PROMPTS) == EXPECTED and raised.calls == 0  # the cache kept the tags the limit cut


def test_503_twice_then_success_is_retried(server, tmp_path, key):
    server.fail_first = 2
    tagger = _tagger(server, tmp_path)
    assert tagger.tag(PROMPTS[:1]) == EXPECTED[:1]
    assert (tagger.retries, tagger.calls) == (2, 3)


def test_429_respects_retry_after_and_gives_up_after_max_retries(server, tmp_path, key):
    server.fail_first, server.fail_status, server.fail_headers = 10, 429, {"Retry-After": "0"}
    tagger = _tagger(server, tmp_path, max_retries=2, backoff_s=5.0)  # Retry-After 0 overrides 5 s
    with pytest.raises(TaggerError, match="429"):
        tagger.tag(PROMPTS[:1])
    assert (tagger.calls, tagger.retries, server.requests) == (3, 2, 3)


def test_401_fails_at_once_with_message_but_without_key(server, tmp_path, key):
    server.mode = "401"
    tagger = _tagger(server, tmp_path)
    with pytest.raises(TaggerError) as err:
        tagger.tag(PROMPTS)
    assert "401" in str(err.value) and "Incorrect API key provided" in str(err.value)
    assert key not in str(err.value) and key not in repr(err.value)
    assert (server.requests, tagger.retries) == (1, 0)


def test_connection_error_is_retried_then_raises(tmp_path, key):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tagger = LLMTagger(f"http://127.0.0.1:{port}", "m", "TAGGER_TEST_KEY", max_retries=1, backoff_s=0.01)
    with pytest.raises(TaggerError, match="ConnectError") as err:
        tagger.tag(["x"])
    assert tagger.retries == 1 and key not in str(err.value)


def test_prose_wrapped_json_is_parsed(server, tmp_path, key):
    server.mode = "prose"
    assert _tagger(server, tmp_path).tag(PROMPTS[:2]) == EXPECTED[:2]


def test_parse_failure_retried_once_then_raises(server, tmp_path, key):
    server.mode = "ramble_once"
    tagger = _tagger(server, tmp_path)
    assert tagger.tag(PROMPTS[:1]) == EXPECTED[:1]
    assert (tagger.calls, tagger.retries) == (2, 1)
    server.mode = "ramble"
    with pytest.raises(ValueError, match="no tags in model output"):
        tagger.tag(["never tagged"])
    assert tagger.calls == 4


def test_key_never_in_repr_or_cache(server, tmp_path, key):
    tagger = _tagger(server, tmp_path)
    tagger.tag(PROMPTS)
    for text in (repr(tagger), str(tagger), str(vars(tagger)), (tmp_path / "tags.jsonl").read_text()):
        assert key not in text
    assert "TAGGER_TEST_KEY" in repr(tagger)


def test_missing_key_names_the_variable(server, tmp_path, monkeypatch):
    monkeypatch.delenv("TAGGER_TEST_KEY", raising=False)
    with pytest.raises(TaggerError, match="TAGGER_TEST_KEY"):
        _tagger(server, tmp_path).tag(PROMPTS)
    assert server.requests == 0


def test_no_key_needed_sends_no_authorization(server, tmp_path):
    assert _tagger(server, tmp_path, api_key_env=None).tag(PROMPTS[:1]) == EXPECTED[:1]
    assert server.auth == [None]


def test_truncated_last_cache_line_is_skipped(server, tmp_path, key):
    path = tmp_path / "tags.jsonl"
    good = json.dumps({"key": cache_key("test-model", PROMPTS[0]), "tags": ["cached tag"]})
    path.write_text(good + "\n" + '{"key": "abc", "tags": ["trunc')  # a run killed mid-write
    tagger = _tagger(server, tmp_path)
    assert tagger.tag(PROMPTS[:2]) == [["cached tag"], EXPECTED[1]]
    assert (tagger.cache_hits, tagger.calls) == (1, 1)
    again = _tagger(server, tmp_path)  # the new entry did not get glued onto the broken line
    assert again.tag(PROMPTS[:2]) == [["cached tag"], EXPECTED[1]] and again.calls == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"tags": ["Math", " math ", "Algebra"]}', ["math", "algebra"]),
        ('["a", "b"]', ["a", "b"]),
        ('```json\n{"tags": ["x"]}\n```', ["x"]),
        ('Here you go: {"tags": ["coding"]} -- done.', ["coding"]),
        ('Tags: ["y", "", "  ", "' + "z" * 65 + '", "w"] as asked', ["y", "w"]),
    ],
)
def test_parse_tags_formats(text, expected):
    assert parse_tags(text) == expected


def test_parse_tags_caps_and_raises():
    assert parse_tags(json.dumps({"tags": [f"t{i}" for i in range(20)]}), max_tags=3) == ["t0", "t1", "t2"]
    with pytest.raises(ValueError, match="no tags in model output: 'I cannot"):
        parse_tags("I cannot tag this " + "x" * 500)
    with pytest.raises(ValueError, match="no tags"):
        parse_tags('{"tags": []}')


def test_llm_source_of_the_sampling_stage_tags_and_caches_under_the_workdir(server, tmp_path, key):
    import pandas as pd

    from rlhf_core.config import SamplingConfig, TaggerConfig
    from rlhf_core.sampling.stage import run_sampling

    tagger = TaggerConfig(source="llm", base_url=server.base_url, model="test-model", api_key_env="TAGGER_TEST_KEY")
    cfg = SamplingConfig(n_samples=2, tagger=tagger)
    pool = pd.DataFrame({"prompt_id": ["p0", "p1", "p2"], "prompt": PROMPTS, "tags": [[], [], []], "source": "t"})
    result = run_sampling(pool, cfg, seed=0, workdir=tmp_path)
    assert result.pool.raw_tags.tolist() == EXPECTED and server.requests == 3
    assert result.sampled["prompt_id"].tolist() == ["p0", "p1"]  # two tags first, then a new tag
    assert result.report["prompt_tag_coverage"] == 1.0 and result.report["mean_tags_raw"] == 4 / 3
    cache = tmp_path / "cache" / "llm_tags.jsonl"
    assert len(cache.read_text().splitlines()) == 3 and key not in cache.read_text()
    run_sampling(pool, cfg, seed=0, workdir=tmp_path)  # a re-run is served from the cache
    assert server.requests == 3


@pytest.mark.parametrize("mode", ["echo_body", "echo_content"])
def test_a_server_echoing_the_key_in_a_200_answer_never_puts_it_in_the_error(server, tmp_path, key, mode):
    server.mode = mode
    tagger = _tagger(server, tmp_path)
    with pytest.raises(ValueError, match="no tags in model output") as err:
        tagger.tag(["x"])
    assert key not in str(err.value) and "***" in str(err.value)
    # sent (and echoed) twice, the parse retry; an answer without reply text each time with the client's retries
    sends = 2 * (tagger.max_retries + 1) if mode == "echo_body" else 2
    assert server.auth == [f"Bearer {key}"] * sends


def test_a_key_pasted_into_api_key_env_is_refused_without_echoing_it(server, tmp_path, monkeypatch):
    from rlhf_core.config import ConfigError, parse_config

    with pytest.raises(TaggerError, match="NAME of an environment variable") as err:
        _tagger(server, tmp_path, api_key_env=KEY).tag(PROMPTS[:1])
    assert KEY not in str(err.value) and server.requests == 0
    with pytest.raises(ConfigError, match="sampling.tagger.api_key_env") as err:
        parse_config({"sampling": {"tagger": {"source": "llm", "base_url": "http://127.0.0.1:1/v1", "model": "m",
                                              "api_key_env": KEY}}})
    assert KEY not in str(err.value) and "value not shown" in str(err.value)
