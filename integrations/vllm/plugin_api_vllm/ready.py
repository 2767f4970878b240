"""Is an OpenAI-compatible vLLM server ready to answer? Readiness, not liveness.

A container that is RUNNING, or a port that accepts connections, says nothing about whether the
model is loaded. This tool waits for three stages in order and exits 0 only when all hold:

    health      GET  URL/health answers 200
    model       GET  URL/v1/models lists the model (--model; any model when absent)
    completion  POST URL/v1/completions with max_tokens=1 succeeds

    python -m plugin_api_vllm.ready http://127.0.0.1:8000 --model my-model --timeout 600

Until the deadline it retries with back-off and says what it waits for. A server that answers
but serves another model will not change its mind: that fails at once. Exit codes name the
stage that failed. Standard library only, so it runs wherever Python does (a laptop, a probe).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

READY, USAGE, HEALTH, MODEL, COMPLETION = 0, 2, 3, 4, 5
STAGE_CODES = {"health": HEALTH, "model": MODEL, "completion": COMPLETION}


@dataclass(frozen=True)
class Outcome:
    """Where the check stands: ``stage`` failed (or "ready"), with the reason."""

    stage: str
    reason: str
    final: bool = False  # True: waiting longer cannot help

    @property
    def code(self) -> int:
        return READY if self.stage == "ready" else STAGE_CODES[self.stage]


class _Http:
    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def request(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def _why(err: BaseException) -> str:
    if isinstance(err, urllib.error.URLError):
        return f"cannot connect ({err.reason})"
    return f"{type(err).__name__}: {err}"


def check_once(http: _Http, model: str | None) -> Outcome:
    """One pass over the three stages; the first that does not hold is the outcome."""
    try:
        status, _ = http.request("/health")
    except (OSError, urllib.error.URLError) as e:
        return Outcome("health", _why(e))
    if status != 200:
        return Outcome("health", f"/health answered {status}")

    try:
        status, body = http.request("/v1/models")
    except (OSError, urllib.error.URLError) as e:
        return Outcome("model", _why(e))
    if status != 200:
        # 401/403: a wrong or missing API key will not fix itself
        return Outcome(
            "model", f"/v1/models answered {status}: {body[:200]!r}", status in (401, 403)
        )
    try:
        served = [m["id"] for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError) as e:
        return Outcome("model", f"/v1/models answered no model list ({e})", True)
    if not served:
        return Outcome("model", "/v1/models lists no model yet")
    if model is not None and model not in served:
        return Outcome("model", f"the server serves {served}, not {model!r}", True)
    name = model or served[0]

    try:
        status, body = http.request(
            "/v1/completions", {"model": name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        )
    except (OSError, urllib.error.URLError) as e:
        return Outcome("completion", _why(e))
    if status != 200:
        # a 4xx is the server refusing this request, retrying the same one cannot help
        final = 400 <= status < 500
        return Outcome(
            "completion", f"one-token completion answered {status}: {body[:300]!r}", final
        )
    try:
        choices = json.loads(body)["choices"]
    except (ValueError, KeyError, TypeError) as e:
        return Outcome("completion", f"one-token completion answered no choices ({e})", True)
    if not choices:
        return Outcome("completion", "one-token completion answered no choices", True)
    return Outcome("ready", f"{name} answers at {http.url}")


def wait_ready(
    url: str,
    *,
    model: str | None = None,
    timeout: float = 600.0,
    api_key: str | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    abort: Callable[[], str | None] = lambda: None,
) -> Outcome:
    """Check until ready, a final failure, or ``timeout`` seconds; report each new state.

    ``abort`` returns a reason to stop waiting (the caller's server process died)."""
    deadline = time.monotonic() + timeout
    delay, last = 0.25, ""
    while True:
        if (why := abort()) is not None:
            return Outcome("health", why, final=True)
        left = deadline - time.monotonic()
        http = _Http(url, api_key, timeout=max(1.0, min(30.0, left)))
        outcome = check_once(http, model)
        if outcome.stage == "ready" or outcome.final:
            return outcome
        left = deadline - time.monotonic()
        if left <= 0:
            return outcome
        line = f"not ready: waiting for {outcome.stage}: {outcome.reason}"
        if line != last:
            say(f"{line} ({left:.0f} s left)")
            last = line
        time.sleep(min(delay, left))
        delay = min(delay * 2, 5.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m plugin_api_vllm.ready",
        description="Exit 0 once an OpenAI-compatible server answers /health, lists the model "
        "and completes one token. Exit 3, 4 or 5 names the stage that failed "
        "(health, model, completion).",
    )
    ap.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", help="the model name the server must list (default: any)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    ap.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="bearer token (default: $VLLM_API_KEY, the one vllm serve checks)",
    )
    ap.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    args = ap.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        ap.error(f"url={args.url!r} must start with http:// or https://")
    if args.timeout <= 0:
        ap.error(f"--timeout={args.timeout} must be positive")
    outcome = wait_ready(args.url, model=args.model, timeout=args.timeout, api_key=args.api_key)
    if args.json:
        print(json.dumps({"ready": outcome.code == READY, "code": outcome.code} | asdict(outcome)))
    elif outcome.stage == "ready":
        print(f"ready: {outcome.reason}", flush=True)
    else:
        print(f"not ready: {outcome.stage} failed: {outcome.reason}", file=sys.stderr, flush=True)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
