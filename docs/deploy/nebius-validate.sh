#!/usr/bin/env bash
# The job of docs/deploy/nebius-validate-job.md, run inside the plugin image on the rented GPU:
# `plugin-api doctor`, the conformance kit, then the benchmark. It reports on its log with two
# marker lines, each followed by one JSON object, which the guide waits for:
#   PLUGIN_API_JOB ready {...}   doctor selected $PLUGIN_API_BACKEND here, from the pinned versions
#   PLUGIN_API_JOB done {...}    each step's exit code and the overall status
# and leaves its files in $RESULTS_ROOT/$RUN_ID (a bucket the job mounts). Files are written to
# local disk first and copied once at the end: bucket mounts refuse renames and metadata changes.
#
# Environment: RUN_ID, PLUGIN_API_BACKEND (required); EXPECT_PLUGIN_API_VERSION and
# EXPECT_PLUGIN_VERSION (the guide's pins; a mismatch means the wrong image, and stops the run
# before the kit); RESULTS_ROOT (default /results).
set -uo pipefail # not -e: every step's exit code is recorded, none stops the report

: "${RUN_ID:?RUN_ID names the results folder of this run}"
: "${PLUGIN_API_BACKEND:?PLUGIN_API_BACKEND is the backend to validate}"
RESULTS_ROOT="${RESULTS_ROOT:-/results}"
work="$(mktemp -d)"

report() { # report KIND JSON: one marker line in the job's log
  printf 'PLUGIN_API_JOB %s %s\n' "$1" "$2"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  >"$work/gpu.txt" 2>&1
export GPU_RC=$?

plugin-api doctor --json >"$work/doctor.json" 2>"$work/doctor.log"
export DOCTOR_RC=$?

# Doctor's verdict and the versions the image carries, as one JSON object (ok: true or false).
ready="$(python3 - "$work/doctor.json" <<'PY'
import json
import os
import sys

backend = os.environ["PLUGIN_API_BACKEND"]
problems = []
try:
    with open(sys.argv[1], encoding="utf-8") as f:
        doctor = json.load(f)
except (OSError, ValueError) as e:
    doctor = {"error": {"message": f"doctor.json unreadable: {e}"}}
if os.environ["DOCTOR_RC"] != "0" or "selection" not in doctor:
    problems.append(doctor.get("error", {}).get("message", "plugin-api doctor failed"))
selection = doctor.get("selection", {})
plugin = next((p for p in doctor.get("plugins", []) if p.get("id") == backend), {})
accelerators = doctor.get("device_info", {}).get("accelerators") or [{}]
found = {
    "plugin-api": doctor.get("host", {}).get("version"),
    plugin.get("distribution", backend): plugin.get("version"),
}
expected = {
    "plugin-api": os.environ.get("EXPECT_PLUGIN_API_VERSION"),
    plugin.get("distribution", backend): os.environ.get("EXPECT_PLUGIN_VERSION"),
}
for name, want in expected.items():
    if want and found[name] != want:
        problems.append(f"{name} {found[name]} in the image, the guide pins {want}")
if selection and selection.get("backend") != backend:
    problems.append(f"doctor selected {selection.get('backend')}, not {backend}")
print(json.dumps({
    "ok": not problems,
    "backend": selection.get("backend"),
    "status": selection.get("status"),
    "gpu": accelerators[0].get("name"),
    "versions": found,
    "problems": problems,
}, separators=(",", ":")))
sys.exit(3 if problems else 0)
PY
)"
ready_rc=$?
if [ "$ready_rc" -eq 0 ]; then
  report ready "$ready"
  (cd "$work" && pytest --plugin-api-backend="$PLUGIN_API_BACKEND" -p no:cacheprovider -q \
    --junitxml="$work/kit.xml") >"$work/kit.log" 2>&1
  export KIT_RC=$?
  plugin-api bench --backend "$PLUGIN_API_BACKEND" --json "$work/bench.json" \
    >"$work/bench.log" 2>&1
  export BENCH_RC=$?
else
  export KIT_RC="" BENCH_RC="" # not run: the image or the machine is not the one pinned
fi

export READY="$ready"
python3 - "$work/summary.json" <<'PY'
import json
import os
import sys

def rc(name):
    value = os.environ.get(name, "")
    return int(value) if value else None

steps = {k: rc(f"{k.upper()}_RC") for k in ("gpu", "doctor", "kit", "bench")}
ready = json.loads(os.environ["READY"] or '{"ok": false, "problems": ["no readiness verdict"]}')
passed = ready["ok"] and all(steps[k] == 0 for k in ("doctor", "kit", "bench"))
summary = {
    "run_id": os.environ["RUN_ID"],
    "backend": os.environ["PLUGIN_API_BACKEND"],
    "status": "passed" if passed else "failed",
    "steps": steps,
    "ready": ready,
}
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
PY

published=true
mkdir -p "$RESULTS_ROOT/$RUN_ID" && cp "$work"/* "$RESULTS_ROOT/$RUN_ID/" || published=false
done_json="$(python3 - "$work/summary.json" "$published" "$RESULTS_ROOT/$RUN_ID" <<'PY'
import json
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    summary = json.load(f)
print(json.dumps({
    "status": summary["status"],
    "steps": summary["steps"],
    "published": sys.argv[2] == "true",
    "results": sys.argv[3],
}, separators=(",", ":")))
sys.exit(0 if summary["status"] == "passed" and sys.argv[2] == "true" else 1)
PY
)"
done_rc=$?
report "done" "$done_json"
exit "$done_rc"
