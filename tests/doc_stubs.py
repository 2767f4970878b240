"""Stand-ins for the external CLIs the docs call, for running their runnable blocks in tests.

``install(bin_dir, tools)`` writes one executable per tool that runs this file as
``doc_stubs.py TOOL ARGS...``. Every call is appended to ``$STUB_STATE/calls.jsonl``; state
lives in ``$STUB_STATE``. An unknown command or flag exits 2, as a real CLI would, so a typo in a
guide fails its test.

- ``nebius``: ``version``, ``config get parent-id``, and ``ai job``
  ``create|get|get-by-name|logs|cancel|delete`` with the flags the Nebius guide uses. ``create``
  runs the job at once on this machine: injected files map to their local sources, the
  ``--volume s3://BUCKET:/results`` mount is a local folder (passed as ``RESULTS_ROOT``), and
  PATH inside the "container" is ``$STUB_CONTAINER_BIN``. Its log and state are then revealed
  one ``get`` at a time: PROVISIONING, STARTING, RUNNING (the log up to the ready report),
  RUNNING, then COMPLETED or FAILED (the whole log). An image not pinned by digest never leaves
  STARTING, like a failed pull.
- ``nebius ai endpoint create|get|get-by-name|list|logs|delete``: ``create`` records the
  endpoint (its token and its ``vllm serve`` arguments included); each ``get`` reveals the next
  state: PROVISIONING (no URL), STARTING (the URL, ``$STUB_ENDPOINT_URL``), then RUNNING, which
  says nothing about the model: ``FakeEndpoint`` answers for it. ``logs`` has the lines vLLM and
  the bridge print while loading. Reads of an endpoint carry its token (``.spec.auth_token``),
  as the real ones do, so a guide that prints them raw leaks it.
- ``aws s3 cp s3://BUCKET/PREFIX/ DEST --recursive --endpoint-url URL`` copies from that folder.
- ``skopeo inspect [--format {{.Digest}}] docker://REPO@DIGEST`` prints the digest, or the
  image's JSON with the version labels ``docs/deploy/serving.Dockerfile`` sets (older ones in
  ``old-image``).
- ``curl``: requests to the Hugging Face API are answered here (a revision exists unless the
  scenario is ``bad-revision``); any other URL goes to the real curl.
- Inside the container: ``nvidia-smi``; ``plugin-api doctor --json`` (canned per
  ``$STUB_SCENARIO``: ``pass``, ``unavailable``, ``kit-fails``, ``old-image``; ``no-pull``
  keeps the job STARTING) and
  ``plugin-api bench``; ``pytest`` (fails in ``kit-fails``).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HOST_TOOLS = ("nebius", "aws", "skopeo", "curl")
CONTAINER_TOOLS = ("nvidia-smi", "plugin-api", "pytest")
TIMELINE = ("PROVISIONING", "STARTING", "RUNNING", "RUNNING")  # then the terminal state
LIVE = {"PROVISIONING", "STARTING", "RUNNING"}


def install(bin_dir: Path, tools: tuple[str, ...]) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        exe = bin_dir / tool
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__)}" {tool} "$@"\n')
        exe.chmod(0o755)
    return bin_dir


def calls(state: Path) -> list[dict]:
    """Every recorded call, in order: ``{"tool": ..., "argv": [...]}``."""
    log = state / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def fail(message: str, code: int = 2) -> int:
    print(f"stub: {message}", file=sys.stderr)
    return code


class Flags:
    """``--name value`` and ``--name=value`` pairs; repeatable flags collect lists."""

    def __init__(self, argv: list[str], known: set[str], booleans: set[str] = frozenset()):
        self.values: dict[str, list[str]] = {}
        self.positional: list[str] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--"):
                self.positional.append(arg)
                i += 1
                continue
            name, eq, value = arg[2:].partition("=")
            if name not in known | booleans:
                raise LookupError(f"unknown flag --{name}")
            if name in booleans:
                value = value if eq else "true"
            elif not eq:
                if i + 1 >= len(argv):
                    raise LookupError(f"--{name} needs a value")
                i += 1
                value = argv[i]
            self.values.setdefault(name, []).append(value)
            i += 1

    def one(self, name: str, default: str | None = None) -> str | None:
        v = self.values.get(name)
        return v[-1] if v else default

    def all(self, name: str) -> list[str]:
        return self.values.get(name, [])


# ---- nebius --------------------------------------------------------------------------------------


def _load(state: Path) -> dict:
    f = state / "nebius.json"
    data = json.loads(f.read_text()) if f.exists() else {}
    return {"jobs": {}, "endpoints": {}, "seq": 0} | data


def _save(state: Path, data: dict) -> None:
    (state / "nebius.json").write_text(json.dumps(data, indent=1))


def _state(job: dict) -> str:
    if job.get("cancelled"):
        return "CANCELLED"
    if job["terminal"] is None:
        return "STARTING" if job["step"] >= 1 else "PROVISIONING"  # never pulled
    i = job["step"]
    return TIMELINE[i] if i < len(TIMELINE) else job["terminal"]


def _view(job: dict) -> dict:
    return {
        "metadata": {"id": job["id"], "name": job["name"], "parent_id": job["parent"]},
        "spec": job["spec"],
        "status": {"state": _state(job)},
    }


def _emit(data: dict, fmt: str | None) -> int:
    if fmt is None or fmt == "json":
        print(json.dumps(data, indent=2))
        return 0
    m = re.fullmatch(r"jsonpath=\{\.([A-Za-z0-9_.]+)\}", fmt)
    if m is None:
        return fail(f"unsupported --format {fmt!r}")
    value: object = data
    for key in m[1].split("."):
        value = value[key] if isinstance(value, dict) and key in value else ""
    print(value)
    return 0


def _run_job(spec: dict, state: Path) -> tuple[list[str], int]:
    """Run the job's command here, as the container would; returns (log lines, exit code)."""
    mounts = {}
    for inject in spec["inject_files"]:
        local, _, inside = inject.partition(":")
        if not Path(local).is_file():
            return [f"inject-file {local}: no such file"], 1
        mounts[inside] = str(Path(local).resolve())
    env = {
        "PATH": f"{os.environ['STUB_CONTAINER_BIN']}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(state),
        "STUB_STATE": str(state),
        "STUB_SCENARIO": os.environ.get("STUB_SCENARIO", "pass"),
    }
    for volume in spec["volumes"]:
        m = re.fullmatch(r"s3://([^:]+):(/[^:]*)(?::(rw|ro))?", volume)
        if m is None:
            return [f"volume {volume!r}: not s3://BUCKET:/path[:rw|ro]"], 1
        bucket = state / "buckets" / m[1]
        bucket.mkdir(parents=True, exist_ok=True)
        if m[2] == "/results":
            env["RESULTS_ROOT"] = str(bucket)
    for pair in spec["env"]:
        key, eq, value = pair.partition("=")
        if not eq:
            return [f"--env {pair!r}: not KEY=VALUE"], 1
        env[key] = value
    argv = [spec["command"], *spec["args"].split(" ")] if spec["args"] else [spec["command"]]
    argv = [mounts.get(a, a) for a in argv]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    return (r.stdout + r.stderr).splitlines(), r.returncode


CREATE_FLAGS = {
    "parent-id", "name", "image", "platform", "preset", "timeout", "restart-policy", "volume",
    "inject-file", "container-command", "args", "env", "subnet-id", "disk-size", "shm-size",
}  # fmt: skip


def nebius(argv: list[str], state: Path) -> int:
    if argv == ["version"]:
        print(os.environ.get("STUB_NEBIUS_VERSION", "0.12.265"))
        return 0
    if argv == ["config", "get", "parent-id"]:
        print("project-e00stub")
        return 0
    if argv[:2] == ["ai", "endpoint"] and len(argv) >= 3:
        return endpoint(argv[2], argv[3:], state)
    if argv[:2] != ["ai", "job"] or len(argv) < 3:
        return fail(f"nebius {' '.join(argv)}: unsupported command")
    verb, rest = argv[2], argv[3:]
    data = _load(state)
    try:
        if verb == "create":
            f = Flags(rest, CREATE_FLAGS, {"async", "dry-run", "preemptible"})
        elif verb in ("get", "get-by-name"):
            f = Flags(rest, {"id", "name", "parent-id", "format"})
        elif verb == "logs":
            f = Flags(rest, {"tail", "since", "until"}, {"timestamps"})
        elif verb in ("cancel", "delete"):
            f = Flags(rest, {"id"}, {"async"})
        else:
            return fail(f"nebius ai job {verb}: unsupported command")
    except LookupError as e:
        return fail(f"nebius ai job {verb}: {e}")
    jobs = data["jobs"]
    if verb == "create":
        name, image = f.one("name"), f.one("image")
        if not name or not image:
            return fail("ai job create: --name and --image are required")
        if any(j["name"] == name for j in jobs.values()):
            return fail(f"AlreadyExists: a job named {name} exists", 1)
        spec = {
            "image": image,
            "platform": f.one("platform"),
            "preset": f.one("preset"),
            "timeout": f.one("timeout", "24h"),
            "command": f.one("container-command"),
            "args": f.one("args", ""),
            "env": f.all("env"),
            "volumes": f.all("volume"),
            "inject_files": f.all("inject-file"),
        }
        if f.one("dry-run"):
            print(json.dumps({"dry_run": True, "spec": spec}))
            return 0
        data["seq"] += 1
        job_id = f"aijob-e00stub{data['seq']:04d}"
        pulled = re.search(r"@sha256:[0-9a-f]{64}$", image) is not None
        pulled = pulled and os.environ.get("STUB_SCENARIO") != "no-pull"
        log, rc = _run_job(spec, state) if pulled and spec["command"] else ([], 0)
        jobs[job_id] = {
            "id": job_id,
            "name": name,
            "parent": f.one("parent-id"),
            "spec": spec,
            "step": 0,
            "log": log,
            "terminal": ("COMPLETED" if rc == 0 else "FAILED") if pulled else None,
        }
        _save(state, data)
        print(json.dumps({"id": f"aiop-e00stub{data['seq']:04d}", "resource_id": job_id}))
        return 0
    if verb == "get-by-name":
        job = next((j for j in jobs.values() if j["name"] == f.one("name")), None)
        if job is None:
            return fail(f"NotFound: no job named {f.one('name')}", 1)
        return _emit(_view(job), f.one("format"))
    job_id = f.positional[0] if verb == "logs" and f.positional else f.one("id")
    job = jobs.get(job_id or "")
    if job is None:
        return fail(f"NotFound: job {job_id}", 1)
    if verb == "get":
        view = _view(job)
        job["step"] += 1
        _save(state, data)
        return _emit(view, f.one("format"))
    if verb == "logs":
        s = _state(job)
        lines = job["log"] if s not in LIVE else []
        if s == "RUNNING":  # the part of the log written before the kit started
            ready = [i for i, ln in enumerate(job["log"]) if "PLUGIN_API_JOB ready" in ln]
            lines = job["log"][: ready[0] + 1] if ready else []
        tail = int(f.one("tail", "0") or 0)
        print("\n".join(lines[-tail:] if tail else lines))
        return 0
    if verb == "cancel":
        if _state(job) in LIVE:
            job["cancelled"] = True
        _save(state, data)
        print("{}")
        return 0
    del jobs[job["id"]]  # delete
    _save(state, data)
    print("{}")
    return 0


# ---- nebius ai endpoint --------------------------------------------------------------------------

ENDPOINT_TIMELINE = ("PROVISIONING", "STARTING")  # then RUNNING, whatever the model does
ENDPOINT_CREATE_FLAGS = {
    "parent-id", "name", "image", "platform", "preset", "container-port", "container-command",
    "args", "env", "auth", "token", "disk-size", "shm-size", "subnet-id", "volume",
}  # fmt: skip
ENDPOINT_BOOLEANS = {"async", "dry-run", "public", "preemptible"}


def _endpoint_state(ep: dict[str, Any]) -> str:
    if os.environ.get("STUB_SCENARIO") == "no-capacity":
        return "PROVISIONING"
    if ep["step"] < len(ENDPOINT_TIMELINE):
        return ENDPOINT_TIMELINE[ep["step"]]
    return "RUNNING"


def _endpoint_view(ep: dict[str, Any]) -> dict[str, Any]:
    state = _endpoint_state(ep)
    urls = [] if state == "PROVISIONING" else [os.environ["STUB_ENDPOINT_URL"]]
    return {
        "metadata": {"id": ep["id"], "name": ep["name"], "parent_id": ep["parent"]},
        "spec": ep["spec"] | {"auth_token": ep["spec"]["token"]},
        "status": {"state": state, "public_endpoints": urls},
    }


def endpoint_log(ep: dict[str, Any]) -> list[str]:
    """What vLLM and the bridge print while the endpoint loads its model."""
    env = dict(e.partition("=")[::2] for e in ep["spec"]["env"])
    backend = env.get("PLUGIN_API_BACKEND")
    lines = [f"INFO vllm serve {ep['spec']['args']}"]
    if backend and os.environ.get("STUB_SCENARIO") != "no-plugin":
        status = (
            "experimental" if os.environ.get("STUB_SCENARIO") == "experimental" else "validated"
        )
        lines += [
            "(EngineCore pid=97) INFO [bridge.py:31] plugin-api serves this model:",
            f"plugin-api backend {backend} (plugin-api-{backend} 0.1.0, {status})",
            f"  attention {backend}:flashinfer [native]: 28 layer(s)",
            "  no fallback",
        ]
    return [*lines, "INFO Application startup complete."]


def endpoint(verb: str, rest: list[str], state: Path) -> int:
    data = _load(state)
    endpoints = data["endpoints"]
    try:
        if verb == "create":
            f = Flags(rest, ENDPOINT_CREATE_FLAGS, ENDPOINT_BOOLEANS)
        elif verb in ("get-by-name", "list"):
            f = Flags(rest, {"name", "parent-id", "format"})
        elif verb == "get":
            f = Flags(rest, {"format"})
        elif verb == "logs":
            f = Flags(rest, {"tail", "since", "until"}, {"timestamps"})
        elif verb == "delete":
            f = Flags(rest, set(), {"async"})
        else:
            return fail(f"nebius ai endpoint {verb}: unsupported command")
    except LookupError as e:
        return fail(f"nebius ai endpoint {verb}: {e}")
    if verb == "create":
        name, image = f.one("name"), f.one("image")
        if not name or not image:
            return fail("ai endpoint create: --name and --image are required")
        if f.one("auth") == "token" and len(f.all("container-port")) != 1:
            return fail("ai endpoint create: token auth needs exactly one HTTP port", 1)
        if f.one("auth") not in (None, "none", "token"):
            return fail(f"ai endpoint create: --auth {f.one('auth')}: none or token")
        if any(j["name"] == name for j in endpoints.values()):
            return fail(f"AlreadyExists: an endpoint named {name} exists", 1)
        spec = {
            "image": image,
            "platform": f.one("platform"),
            "preset": f.one("preset"),
            "ports": f.all("container-port"),
            "command": f.one("container-command"),
            "args": f.one("args", ""),
            "env": f.all("env"),
            "auth": f.one("auth", "none"),
            "token": f.one("token", ""),
            "disk_size": f.one("disk-size"),
            "shm_size": f.one("shm-size"),
            "public": f.one("public", "false") != "false",
        }
        if f.one("dry-run"):
            print(json.dumps({"dry_run": True, "spec": spec}))
            return 0
        data["seq"] += 1
        ep_id = f"aiendpoint-e00stub{data['seq']:04d}"
        endpoints[ep_id] = {
            "id": ep_id, "name": name, "parent": f.one("parent-id"), "spec": spec, "step": 0
        }  # fmt: skip
        _save(state, data)
        print(json.dumps({"id": f"aiop-e00stub{data['seq']:04d}", "resource_id": ep_id}))
        return 0
    if verb == "list":
        items = [_endpoint_view(e) for e in endpoints.values() if e["parent"] == f.one("parent-id")]
        return _emit({"items": items} if items else {}, f.one("format"))  # empty: bare {}
    if verb == "get-by-name":
        ep = next((e for e in endpoints.values() if e["name"] == f.one("name")), None)
        if ep is None:
            return fail(f"NotFound: no endpoint named {f.one('name')}", 1)
        return _emit(_endpoint_view(ep), f.one("format"))
    ep = endpoints.get(f.positional[0] if f.positional else "")
    if ep is None:
        return fail(f"rpc error: code = NotFound desc = endpoint {f.positional[:1]} not found", 1)
    if verb == "get":
        view = _endpoint_view(ep)
        ep["step"] += 1
        _save(state, data)
        return _emit(view, f.one("format"))
    if verb == "logs":
        lines = endpoint_log(ep) if _endpoint_state(ep) == "RUNNING" else []
        tail = int(f.one("tail", "0") or 0)
        print("\n".join(lines[-tail:] if tail else lines))
        return 0
    del endpoints[ep["id"]]  # delete: synchronous, as without --async
    _save(state, data)
    print("{}")
    return 0


class FakeEndpoint:
    """An endpoint's HTTPS URL: Nebius's token check in front of vLLM's OpenAI-compatible server.

    It serves what the recorded endpoint was told (``vllm serve MODEL ...``) and behaves per
    scenario: ``pass`` (the ingress answers 404 once, /health 503 while loading, then ready),
    ``never-loads`` (/health 503 for ever), ``wrong-model`` (serves another model),
    ``completion-fails`` (500 on every completion), ``open`` (no token check). ``requests``
    lists what it was asked, in order."""

    LOADING = 1  # /health answers 503 this many times after the ingress's first 404

    def __init__(self, state: Path, scenario: str, cert: Path, key: Path) -> None:
        self.state, self.scenario = state, scenario
        self.requests: list[dict[str, Any]] = []
        self._health = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._answer(self, None)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                fake._answer(self, json.loads(self.rfile.read(n) or b"null"))

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, h: http.server.BaseHTTPRequestHandler, body: Any) -> None:
        eps = list(_load(self.state)["endpoints"].values())
        spec = eps[0]["spec"] if eps else None
        token = f"Bearer {spec['token']}" if spec and spec["auth"] == "token" else None
        authorized = self.scenario == "open" or token is None or h.headers["Authorization"] == token
        self.requests.append(
            {"method": h.command, "path": h.path, "authorized": authorized, "body": body}
        )
        code, reply = self._route(h.path, body, spec, authorized)
        self.requests[-1]["status"] = code
        raw = json.dumps(reply).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    def _route(
        self, path: str, body: Any, spec: dict[str, Any] | None, authorized: bool
    ) -> tuple[int, Any]:
        if spec is None:
            return 404, {"error": "no such endpoint"}
        if not authorized:
            return 401, {"error": "missing or invalid token"}
        words = spec["args"].split(" ")
        served = "other/model" if self.scenario == "wrong-model" else words[1]
        if path == "/health":
            self._health += 1
            if self._health == 1:
                return 404, {"error": "no route yet"}  # the URL exists before the ingress routes
            if self.scenario == "never-loads" or self._health <= 1 + self.LOADING:
                return 503, {"error": "loading"}
            return 200, {}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": served, "object": "model"}]}
        if path in ("/v1/completions", "/v1/chat/completions"):
            if not isinstance(body, dict) or body.get("model") != served:
                return 404, {"error": {"message": f"The model does not exist: {body!r}"}}
            if self.scenario == "completion-fails":
                return 500, {"error": {"message": "CUDA error: an illegal memory access"}}
            if path == "/v1/completions":
                return 200, {"choices": [{"index": 0, "text": " there"}]}
            msg = {"role": "assistant", "content": "A GPU is a processor built for parallel work."}
            return 200, {"choices": [{"index": 0, "message": msg}]}
        return 404, {"error": f"no route {path}"}


# ---- the other host tools ------------------------------------------------------------------------


def aws(argv: list[str], state: Path) -> int:
    try:
        f = Flags(argv[2:], {"endpoint-url"}, {"recursive"})
    except LookupError as e:
        return fail(f"aws: {e}")
    if argv[:2] != ["s3", "cp"] or len(f.positional) != 2 or not f.one("recursive"):
        return fail(f"aws {' '.join(argv)}: unsupported command")
    if not f.one("endpoint-url"):
        return fail("aws: Nebius Object Storage needs --endpoint-url", 1)
    m = re.fullmatch(r"s3://([^/]+)/(.*)", f.positional[0])
    if m is None:
        return fail(f"aws: {f.positional[0]} is not s3://BUCKET/PREFIX")
    src = state / "buckets" / m[1] / m[2]
    if not src.is_dir():
        return fail(f"aws: nothing at {f.positional[0]}", 1)
    shutil.copytree(src, f.positional[1], dirs_exist_ok=True)
    return 0


def image_labels(old: bool = False) -> dict[str, str]:
    """The version labels docs/deploy/serving.Dockerfile sets, from its ARG defaults."""
    text = (Path(__file__).resolve().parents[1] / "docs/deploy/serving.Dockerfile").read_text()
    args = dict(re.findall(r"^ARG ([A-Z0-9_]+)=(\S+)$", text, re.MULTILINE))
    labels = re.findall(r"(org\.plugin-api\.version\.[a-z0-9-]+)=\$\{([A-Z0-9_]+)\}", text)
    out = {label: args[arg] for label, arg in labels}
    if old:
        out["org.plugin-api.version.plugin-api-vllm"] = "0.0.9"
    return out


def skopeo(argv: list[str], state: Path) -> int:
    fmt = argv[2] if argv[1:2] == ["--format"] else None
    if (
        argv[:1] != ["inspect"]
        or len(argv) != (4 if fmt else 2)
        or fmt not in (None, "{{.Digest}}")
    ):
        return fail(f"skopeo {' '.join(argv)}: unsupported command")
    m = re.fullmatch(r"docker://[^@]+@(sha256:[0-9a-f]{64})", argv[-1])
    if m is None:
        return fail(f"skopeo: {argv[-1]} is not docker://REPO@sha256:DIGEST", 1)
    if fmt:
        print(m[1])
        return 0
    labels = image_labels(old=os.environ.get("STUB_SCENARIO") == "old-image")
    print(json.dumps({"Digest": m[1], "Architecture": "amd64", "Labels": labels}, indent=2))
    return 0


HUB_REVISION = re.compile(r"https://huggingface\.co/api/models/([^/]+/[^/]+)/revision/([^/?]+)")


def curl(argv: list[str]) -> int:
    """The Hugging Face API answered here; every other request goes to the real curl."""
    hub = next((m for m in map(HUB_REVISION.fullmatch, argv) if m), None)
    if hub is None:
        real = shutil.which("curl", path="/usr/bin:/bin")
        if real is None:
            return fail("no real curl in /usr/bin or /bin (apt-get install curl)", 127)
        os.execv(real, [real, *argv])
    if os.environ.get("STUB_SCENARIO") == "bad-revision":
        print(f"curl: (22) The requested URL returned error: 404 ({hub[0]})", file=sys.stderr)
        return 22
    print(json.dumps({"id": hub[1], "sha": hub[2], "private": False}))
    return 0


# ---- inside the container ------------------------------------------------------------------------


def doctor(scenario: str) -> tuple[dict, int]:
    backend = os.environ.get("PLUGIN_API_BACKEND", "reference")
    version = "0.0.9" if scenario == "old-image" else "0.1.0"
    report = {
        "host": {"version": version, "api": "1.0"},
        "what_if": False,
        "device_info": {"accelerators": [{"name": "NVIDIA H200", "arch": "sm_90"}]},
        "plugins": [
            {"id": backend, "distribution": f"plugin-api-{backend}", "version": version},
        ],
    }
    if scenario == "unavailable":
        msg = f"PLUGIN_API_BACKEND={backend!r} is unavailable here (no fallback is made)"
        return report | {"error": {"type": "BackendUnavailable", "message": msg}}, 1
    report["selection"] = {"backend": backend, "status": "validated"}
    return report, 0


def plugin_api(argv: list[str], scenario: str) -> int:
    if argv[:2] == ["doctor", "--json"]:
        report, rc = doctor(scenario)
        print(json.dumps(report))
        return rc
    if argv[:1] == ["bench"] and "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text('{"cases": []}\n')
        return 0
    return fail(f"plugin-api {' '.join(argv)}: unsupported command")


def pytest_(argv: list[str], scenario: str) -> int:
    xml = next((a.split("=", 1)[1] for a in argv if a.startswith("--junitxml=")), None)
    failures = 1 if scenario == "kit-fails" else 0
    if xml:
        Path(xml).write_text(f'<testsuite name="kit" tests="3" failures="{failures}"/>\n')
    print(f"{3 - failures} passed, {failures} failed")
    return failures


def main(argv: list[str]) -> int:
    tool, args = argv[0], argv[1:]
    state = Path(os.environ["STUB_STATE"])
    state.mkdir(parents=True, exist_ok=True)
    with (state / "calls.jsonl").open("a") as log:
        log.write(json.dumps({"tool": tool, "argv": args}) + "\n")
    scenario = os.environ.get("STUB_SCENARIO", "pass")
    if tool == "nebius":
        return nebius(args, state)
    if tool == "aws":
        return aws(args, state)
    if tool == "skopeo":
        return skopeo(args, state)
    if tool == "curl":
        return curl(args)
    if tool == "nvidia-smi":
        print("NVIDIA H200, 570.124.06, 143771 MiB")
        return 0
    if tool == "plugin-api":
        return plugin_api(args, scenario)
    if tool == "pytest":
        return pytest_(args, scenario)
    return fail(f"no stub for {tool}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
