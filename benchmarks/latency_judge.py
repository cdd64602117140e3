"""A latency judge for benchmarks: a loopback OpenAI-compatible proxy that answers each chat request as its upstream
does (experiments.serve on the tiny judge: the same verdicts), `delay_s` seconds after the request arrived. The wait is
a sleeping thread per request (no CPU), so it stands for an API judge's network and queueing latency without taking
the cores the trainer measures. GET requests (/v1/models, /health) pass straight through."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_HEADERS = {"connection", "transfer-encoding", "keep-alive", "content-length"}


class _Handler(BaseHTTPRequestHandler):
    server: LatencyJudge

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _relay(self, body: bytes | None) -> None:
        """Forwards this request to the upstream and writes its answer back (status, headers, body)."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS | {"host"}}
        request = urllib.request.Request(self.server.upstream + self.path, data=body, headers=headers,
                                         method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                status, answer_headers, data = answer.status, answer.headers.items(), answer.read()
        except urllib.error.HTTPError as e:
            status, answer_headers, data = e.code, e.headers.items(), e.read()
        self.send_response(status)
        for name, value in answer_headers:
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._relay(None)

    def do_POST(self) -> None:
        """Sleeps until `delay_s` after the request arrived, then relays it."""
        arrived = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(max(0.0, arrived + self.server.delay_s - time.monotonic()))
        self._relay(body)


class LatencyJudge(ThreadingHTTPServer):
    """The proxy on 127.0.0.1 (a free port), serving from a daemon thread until `close()`; `base_url` is its root."""

    daemon_threads = True

    def __init__(self, upstream: str, delay_s: float):
        if not delay_s >= 0:
            raise ValueError(f"delay_s={delay_s!r}: expected a number >= 0")
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.delay_s = upstream.rstrip("/"), delay_s
        self._thread = threading.Thread(target=self.serve_forever, name="latency-judge", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        """Stops serving and frees the port."""
        self.shutdown()
        self.server_close()
        self._thread.join()
