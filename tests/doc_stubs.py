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
- ``aws s3 cp s3://BUCKET/PREFIX/ DEST --recursive --endpoint-url URL`` copies from that folder.
- ``skopeo inspect --format {{.Digest}} docker://REPO@DIGEST`` prints the digest.
- Inside the container: ``nvidia-smi``; ``plugin-api doctor --json`` (canned per
  ``$STUB_SCENARIO``: ``pass``, ``unavailable``, ``kit-fails``, ``old-image``; ``no-pull``
  keeps the job STARTING) and
  ``plugin-api bench``; ``pytest`` (fails in ``kit-fails``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HOST_TOOLS = ("nebius", "aws", "skopeo")
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
    return json.loads(f.read_text()) if f.exists() else {"jobs": {}, "seq": 0}


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


def skopeo(argv: list[str], state: Path) -> int:
    if len(argv) != 4 or argv[:3] != ["inspect", "--format", "{{.Digest}}"]:
        return fail(f"skopeo {' '.join(argv)}: unsupported command")
    m = re.fullmatch(r"docker://[^@]+@(sha256:[0-9a-f]{64})", argv[3])
    if m is None:
        return fail(f"skopeo: {argv[3]} is not docker://REPO@sha256:DIGEST", 1)
    print(m[1])
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
