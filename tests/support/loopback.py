"""A threaded HTTP server on 127.0.0.1 for the test stand-ins (vLLM's /health, the Hub, the
fault-injecting S3 proxy, the Kubernetes API): bound to port 0, so the kernel hands it a free
port that is ours by construction, served in the background while the `with` block runs, and
shut down (its socket closed) when it ends."""

from __future__ import annotations

import http.server
import threading


class LoopbackServer:
    """Base of a stand-in: call `_serve(Handler)` in `__init__`, use it in a `with` block."""

    httpd: http.server.ThreadingHTTPServer
    thread: threading.Thread

    def _serve(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True  # a request still in flight never holds the test run
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
