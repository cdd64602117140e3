"""A scripted OpenAI-compatible endpoint on 127.0.0.1 for tests of the HTTP judge paths: GET /v1/models lists
one model (with `weights_identity` when the test sets `identity`, as experiments.serve reports it); POST
/v1/chat/completions answers `reply(messages)` (default `SCORE: 1`) and records each request's last message. A
reply may be a dict instead of the content: "status" and "headers" of the HTTP answer, and any of the choice's
"content", "finish_reason", "refusal" and the body's "usage" replaced (a hostile or odd endpoint). The test can take
it down (connections refused) and bring it back on the same port."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, body: dict, status: int = 200, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        identity = self.server.endpoint.identity
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}
        self._send({"object": "list", "data": [model | ({"weights_identity": identity} if identity else {})]})

    def do_POST(self) -> None:
        messages = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))["messages"]
        endpoint = self.server.endpoint
        with endpoint.lock:
            endpoint.requests.append(messages[-1]["content"])
        reply = endpoint.reply(messages)
        script = reply if isinstance(reply, dict) else {"content": reply}
        message = {"role": "assistant", "content": script.get("content", "")}
        if "refusal" in script:
            message["refusal"] = script["refusal"]
        choice = {"index": 0, "finish_reason": script.get("finish_reason", "stop"), "message": message}
        usage = script.get("usage", {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13})
        self._send({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL, "choices": [choice],
                    "usage": usage}, script.get("status", 200), script.get("headers"))


class Endpoint:
    """The scripted endpoint on a fixed port; `requests` holds every chat request's last message, in order."""

    def __init__(self, port: int | None = None, reply: Callable[[list[dict]], str | dict] = lambda messages: "SCORE: 1",
                 identity: str = ""):
        self.port, self.reply, self.server, self.identity = port or free_port(), reply, None, identity
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[str] = []
        self.lock = threading.Lock()

    def up(self) -> Endpoint:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        self.server.endpoint = self
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
