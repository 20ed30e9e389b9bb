"""A real OpenAI-compatible chat-completions server on 127.0.0.1 that judges with the simulation's oracle.

It reads the question and both answers back out of the pairwise judging prompt, asks the
OracleJudge, and answers "[[A]]", "[[B]]" or "[[C]]"; from a single-answer grading prompt it reads
the question and the answer and answers "Rating: [[r]]", the oracle's grade to one decimal. Tests
script failures for the next requests (`server.script`) and read what was sent (`server.requests`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlhf_core.judge.oracle import OracleJudge

_PROMPT = re.compile(r"\[User Question\]\n(.*)\n\n\[The Start of Assistant A's Answer\]\n(.*)\n"
                     r"\[The End of Assistant A's Answer\]\n\n\[The Start of Assistant B's Answer\]\n(.*)\n"
                     r"\[The End of Assistant B's Answer\]", re.DOTALL)
_GRADING_PROMPT = re.compile(r"\[Instruction\]\n.*\n\n\[Question\]\n(.*)\n\n\[The Start of Assistant's Answer\]\n(.*)\n"
                             r"\[The End of Assistant's Answer\]", re.DOTALL)
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 20  # what every answer reports in `usage`


def oracle_reply(user_message: str, tie_margin: float = 0.25) -> str:
    grading = _GRADING_PROMPT.fullmatch(user_message)
    if grading:
        grade = OracleJudge(tie_margin).grade(*grading.groups())
        return f"{grade.rationale}. Rating: [[{grade.rating:.1f}]]"
    question, answer_a, answer_b = _PROMPT.fullmatch(user_message).groups()
    outcome, why = OracleJudge(tie_margin).compare(question, answer_a, answer_b)
    return f"{why}. [[{ {'first': 'A', 'second': 'B', 'tie': 'C'}[outcome]}]]"


class JudgeServer:
    """`script`: behaviours for the next requests, in order, each one of
    ("status", code, headers[, message prefix]) | ("sleep", seconds) | ("body", dict) | ("reply", text);
    when empty, the oracle answers. `always`: a reply text for every request instead of the oracle."""

    def __init__(self):
        self.script: list[tuple] = []
        self.always: str | None = None
        self.requests: list[dict] = []  # {"time", "headers", "body"} of every request received
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append({"time": time.monotonic(), "headers": dict(self.headers), "body": body})
                    step = server.script.pop(0) if server.script else None
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if step and step[0] == "status":
                    # echo the Authorization header, as a careless proxy might: the client must scrub it
                    prefix = step[3] if len(step) > 3 else ""  # e.g. a long one, so the cut lands inside the key
                    message = f"{prefix}scripted failure (auth was {self.headers.get('Authorization')})"
                    return self._send(step[1], {"error": {"message": message}}, step[2])
                if step and step[0] == "sleep":
                    time.sleep(step[1])
                if step and step[0] == "body":
                    return self._send(200, step[1])
                reply = step[1] if step and step[0] == "reply" else server.always
                if reply is None:
                    reply = oracle_reply(body["messages"][-1]["content"])
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": reply}}],
                                 "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS}})

            def _send(self, code, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> JudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
