"""A small forwarding HTTP proxy in front of the real registry that misbehaves on command.

Rules match a method and a path fragment and either answer HTTP 500, hang (no answer until
the client gives up), or delay the request before forwarding it. Optionally it demands a bearer
token and serves one at ``/token`` (for the client's auth flow). Everything else is forwarded
unchanged, Host header included, so the registry's Location headers point back at the proxy.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Action = Literal["fail", "hang", "delay"]
_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length"}


@dataclass(frozen=True)
class Rule:
    action: Action
    path: str = ""  # substring of the request path
    method: str | None = None  # None: any
    seconds: float = 0.0  # hang/delay


class FaultyProxy:
    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.rules: list[Rule] = []
        self.seen: list[tuple[str, str]] = []
        self.token: str | None = None  # when set, /v2/ requests need "Bearer <token>"
        self.credentials = ("ci", "secret")
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, method: str, fragment: str) -> int:
        with self._lock:
            return sum(1 for m, p in self.seen if m == method and fragment in p)

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.seen.append((self.command, self.path))
                if self.path.startswith("/token"):
                    return self._token()
                if proxy.token and self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    return self._challenge()
                for rule in list(proxy.rules):
                    if rule.path in self.path and rule.method in (None, self.command):
                        if rule.action == "fail":
                            return self._reply(500, b'{"errors":[{"code":"UNKNOWN"}]}', {})
                        if rule.action == "hang":
                            proxy._closing.wait(rule.seconds)
                            self.close_connection = True
                            return None
                        time.sleep(rule.seconds)
                self._forward(body)
                return None

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

            def _forward(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers.pop("Authorization", None)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                out = {k: v for k, v in r.getheaders() if k.lower() not in _HOP}
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self._reply(r.status, data, out, length)
                conn.close()

            def _challenge(self) -> None:
                realm = f"{proxy.url}/token"
                header = f'Bearer realm="{realm}",service="faulty",scope="repository:x:pull,push"'
                self._reply(
                    401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": header}
                )

            def _token(self) -> None:
                user, password = proxy.credentials
                expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    return self._reply(401, b"{}", {})
                body = json.dumps({"token": proxy.token}).encode()
                return self._reply(200, body, {"Content-Type": "application/json"})

            def _reply(
                self, status: int, body: bytes, headers: dict[str, str], length: str | None = None
            ) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", length or str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        return Handler
