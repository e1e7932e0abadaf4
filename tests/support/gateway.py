"""A rate-limiting gateway in front of a real server, as teams put one before their model server (nginx
`limit_req`, an API gateway): it answers the first requests itself — 429 with Retry-After, a 5xx, or a body that
is not JSON — and forwards every other request to the server unchanged."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def gateway(upstream: str, refusals: list[tuple[int, dict[str, str], bytes]], *, after: int = 0,
            dies_after: int | None = None) -> Iterator[str]:
    """Yields the gateway's base URL (…/v1). The first `after` requests go through; `refusals` are (status,
    headers, body) answered to the next ones in order; later requests go to `upstream` (a base URL …/v1). With
    `dies_after` N it dies as a crashed replica does: request N+1 and every one in flight with it get no reply
    (the connection drops) and it stops listening (connections refused)."""
    pending: list[tuple[int, dict[str, str], bytes] | None] = [None] * after + list(refusals)
    lock = threading.Lock()
    seen = [0]
    dead = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                seen[0] += 1
                if dies_after is not None and seen[0] > dies_after and not dead.is_set():
                    dead.set()
                    threading.Thread(target=stop_listening, args=(server,), daemon=True).start()
            if dead.is_set():
                self.close_connection = True  # no reply: the client sees the connection drop
                return
            with lock:
                refusal = pending.pop(0) if pending else None
            if refusal is not None:
                status, headers, payload = refusal
            else:
                request = urllib.request.Request(upstream.rstrip("/") + self.path.removeprefix("/v1"), data=body,
                                                 headers={"content-type": "application/json"}, method="POST")
                try:
                    with urllib.request.urlopen(request, timeout=300) as reply:
                        status, headers, payload = reply.status, {}, reply.read()
                except urllib.error.HTTPError as exc:
                    status, headers, payload = exc.code, {}, exc.read()
            self.send_response(status)
            for name, value in {"content-type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def stop_listening(server: ThreadingHTTPServer) -> None:
    """Shut a dying gateway down and close its socket, so new connections are refused."""
    server.shutdown()
    server.server_close()
