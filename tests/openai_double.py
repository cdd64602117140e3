"""A scripted OpenAI-compatible endpoint on 127.0.0.1 for tests of the HTTP judge paths: GET /v1/models lists
one model; POST /v1/chat/completions answers `reply(messages)` (default `SCORE: 1`) and records each request's
last message. The test can take it down (connections refused) and bring it back on the same port."""

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

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}]})

    def do_POST(self) -> None:
        messages = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))["messages"]
        endpoint = self.server.endpoint
        with endpoint.lock:
            endpoint.requests.append(messages[-1]["content"])
        self._send({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": endpoint.reply(messages)}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})


class Endpoint:
    """The scripted endpoint on a fixed port; `requests` holds every chat request's last message, in order."""

    def __init__(self, port: int | None = None, reply: Callable[[list[dict]], str] = lambda messages: "SCORE: 1"):
        self.port, self.reply, self.server = port or free_port(), reply, None
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
