"""Every distribution of the repository built (sdist + wheel) and its wheels checked as a user
gets them: a fresh venv with torch, then the wheels alone (no editable install, no source tree
on ``sys.path``), everything run from outside the repository. ``make wheel-check`` runs it (and
``make test``); the lines that start with ``wheel-only:`` are the record in the CI log.

usage: .venv/bin/python tests/wheels/wheel_check.py [--dist DIR] [--keep] [--kit EXPR]

The fresh venv gets the torch release this interpreter has (the pin, from the project venv), the
one the cpu-arm-acl wheel is compiled against and requires. Elsewhere than x86_64 (the
emulated-Arm tool runs it in an arm64 chroot with PyPI's aarch64 CPU torch, not the pin) the
cpu-arm-acl build skips ``python -m build``'s check of its pinned build requirements, and the
oneDNN to compile against and run with comes from ``PLUGIN_API_ONEDNN_ROOT``.

The wheels are built with ``python -m build --no-isolation`` from the project venv, which has
every build requirement (the Makefile installs them): an isolated build would install
setuptools for each distribution, and torch and oneDNN's headers for cpu-arm-acl's, again on
every run. They are built from a clean copy of the working tree (``build/wheel-check-tree``:
tracked and new files, no ignored ones). cpu-arm-acl's wheel is built from that copy, with its
objects in ``build/wheel-check-native-<machine>``, kept between runs (a rebuild compiles only
what changed); the others' wheels are built from their sdists, which checks that the sdists are
complete.

What it asserts, in order:
- every distribution builds an sdist and a wheel; cpu-arm-acl's wheel is platform-tagged,
  carries a prebuilt library per ISA variant and requires exactly the build's torch;
- ``pip install`` of the cpu-arm-acl wheel alone (torch already there) pulls the host wheel;
- the host and plugins import from the venv's site-packages;
- the first ``prepare`` + ``mm`` + attention call works and no compiler runs: ``g++``, ``c++``,
  ``gcc``, ``cc`` and ``ninja`` on PATH are shims that record a call and fail, and the cache
  folder (XDG_CACHE_HOME, where a JIT build would go) stays empty; the time is printed;
- ``plugin-api doctor``, ``plugin-api check`` on reference and cpu-arm-acl, and the README's
  "Using the ops" block exit 0 (and print no NumPy warning when the host declares numpy);
- every prebuilt library of the wheel that this CPU runs (each ISA variant it has) loads and
  answers a call; the others are listed, not loaded;
- a manifest recording another torch minor makes the probe refuse cpu-arm-acl, with the reason;
- uninstalling one plugin leaves ``plugin-api list`` working with the others.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable  # the project venv's: it has build, setuptools and the native toolchain
# (source folder, distribution name); cpu-arm-acl first: its wheel takes minutes
DISTRIBUTIONS = (
    ("plugins/cpu-arm-acl", "plugin-api-cpu-arm-acl"),
    (".", "plugin-api"),
    ("plugins/cuda-sm90", "plugin-api-cuda-sm90"),
    ("plugins/rocm", "plugin-api-rocm"),
    ("plugins/xpu", "plugin-api-xpu"),
    ("integrations/vllm", "plugin-api-vllm"),
    ("docs/examples/plugin-api-example", "plugin-api-example"),
)
NATIVE = "plugins/cpu-arm-acl"
TREE = REPO / "build" / "wheel-check-tree"  # ignored (build/); rebuilt on every run
# setup.py's object folder for the native build, kept between runs (ignored, build/)
NATIVE_BUILD_ENV = "PLUGIN_API_CPU_ARM_ACL_BUILD_DIR"
NATIVE_BUILD = REPO / "build" / f"wheel-check-native-{os.uname().machine}"
TORCH = "torch==2.13.0"  # the pin (Makefile, wheel_backend.py's build requirements)
COMPILERS = ("g++", "c++", "gcc", "cc", "ninja")
FIRST_CALL = """
import json, time
t0 = time.perf_counter()
import torch
import plugin_api as pa
t1 = time.perf_counter()
w = pa.prepare(torch.randn(256, 512, dtype=torch.bfloat16), out_dtype=torch.float32)
y = pa.mm(torch.randn(4, 512, dtype=torch.bfloat16), w)
spec = pa.AttentionSpec(num_heads=4, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
attn = pa.attention(spec)
cache = attn.allocate_kv_cache(4)
batch = pa.AttentionBatch.from_lists(
    query_lens=[3], seq_lens=[3], block_table=[[1]], slot_mapping=[16, 17, 18]
)
plan = attn.plan(batch)
q, k, v = (torch.randn(3, h, 64, dtype=torch.bfloat16) for h in (4, 2, 2))
out = torch.empty_like(q)
attn.run(q, k, v, cache, plan, out=out)
t2 = time.perf_counter()
assert torch.isfinite(y).all() and torch.isfinite(out).all()
# the libraries that ran are the wheel's (a torch fallback would also give finite numbers)
maps = open("/proc/self/maps").read().splitlines()
loaded = sorted({ln.rsplit("/", 1)[1] for ln in maps if "/_prebuilt/" in ln})
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1, "loaded": loaded,
                  "gemm": str(w.provenance), "attention": str(attn.provenance)}))
"""
# one library per process: the GEMM variants share their op namespace
LOAD_ONE = """
import sys
import torch
from plugin_api.device_info import read_device_info
from plugin_api_cpu_arm_acl import native, prebuilt, settings
from plugin_api_cpu_arm_acl.locate import locate
kind, variant = sys.argv[1:]
# a variant for a wider ISA than this CPU's may fault on load: it is reported, not loaded
isa = next(v for v in (native.GEMM_VARIANTS if kind == "gemm" else native.ISA_PATHS)
           if v.name == variant)
missing = sorted(isa.needs - read_device_info().cpu_flags)
if missing:
    print("not loaded: this CPU lacks " + " ".join(missing))
elif kind == "gemm":
    prebuilt.preload_onednn(locate(settings.read().root).library)
    prebuilt.load_library(prebuilt.gemm_library(variant))
    print("oneDNN", torch.ops.pa_cpu_onednn.onednn_version())
else:
    prebuilt.load_library(prebuilt.attention_library(variant))
    limits = dict(getattr(torch.ops, f"pa_cpu_attn_{variant}").limits())
    print("vector width", limits["vector_width"])
"""


def log(message: str) -> None:
    print(f"wheel-only: {message}", flush=True)


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass(frozen=True)
class Venv:
    root: Path
    env: dict[str, str]  # PATH with the compiler shims first, an empty cache folder

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def run(
        self,
        *args: str,
        cwd: Path,
        stdin: str | None = None,
        check: bool = True,
        backend: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``args`` in the venv (a bare command name resolves to its bin/), output captured;
        ``backend``: PLUGIN_API_BACKEND for this run."""
        exe = self.root / "bin" / args[0]
        cmd = [str(exe) if exe.exists() else args[0], *args[1:]]
        env = self.env | ({"PLUGIN_API_BACKEND": backend} if backend else {})
        done = subprocess.run(
            cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise CheckFailed(
                f"{' '.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}\n"
                f"{done.stderr[-3000:]}"
            )
        return done

    def pip(self, *args: str, cwd: Path) -> float:
        started = time.perf_counter()
        self.run("python", "-m", "pip", "install", "-q", *args, cwd=cwd)
        return time.perf_counter() - started


def clean_tree() -> Path:
    """A copy of what a checkout of the working tree holds (tracked and new files, not ignored
    ones: no build folders, egg-info or caches), at a fixed path with the files' times kept,
    so that the native build's ninja folder (outside it) stays valid between runs."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shutil.rmtree(TREE, ignore_errors=True)
    for rel in filter(None, listed.split("\0")):
        source = REPO / rel
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (TREE / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, TREE / rel)
    return TREE


def build_all(dist: Path) -> dict[str, float]:
    tree = clean_tree()
    log(f"building from a clean copy of the working tree: {tree}")
    env = os.environ | {NATIVE_BUILD_ENV: str(NATIVE_BUILD)}
    skip_check = []
    if torch_spec() != TORCH:
        # the build requirements pin TORCH; the wheel is compiled against (and requires) the
        # torch this venv has, which python -m build would otherwise refuse as a missing pin
        skip_check = ["--skip-dependency-check"]
        log(f"building cpu-arm-acl against {torch_spec()} (this venv's), not the pin {TORCH}")
    seconds: dict[str, float] = {}
    for folder, name in DISTRIBUTIONS:
        # the native build compiles from the tree (its objects kept in NATIVE_BUILD, and its
        # sdist's contents checked by check_native_wheel); the others build their wheel from
        # the sdist just made (python -m build's default), which checks the sdist is complete
        how = ["--sdist", "--wheel", *skip_check] if folder == NATIVE else []
        started = time.perf_counter()
        done = subprocess.run(
            [PY, "-m", "build", "--no-isolation", *how, "--outdir", str(dist), str(tree / folder)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        seconds[name] = time.perf_counter() - started
        if done.returncode != 0:
            raise CheckFailed(
                f"python -m build {folder} failed\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        sdist, wheel = artifacts(dist, name)
        log(
            f"built {name}: {sdist.name} ({size(sdist)}), {wheel.name} ({size(wheel)}) "
            f"in {seconds[name]:.0f} s"
        )
    return seconds


def artifacts(dist: Path, name: str) -> tuple[Path, Path]:
    stem = name.replace("-", "_")
    sdists = sorted(dist.glob(f"{stem}-*.tar.gz"))
    wheels = sorted(dist.glob(f"{stem}-*.whl"))
    expect(
        len(sdists) == 1 and len(wheels) == 1,
        f"{name}: expected one sdist and one wheel in {dist}, found "
        f"{[p.name for p in sdists + wheels]}",
    )
    return sdists[0], wheels[0]


def size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def check_native_wheel(dist: Path) -> None:
    """The cpu-arm-acl wheel: platform tag, one library per variant, the manifest, the pin."""
    import tarfile

    import torch

    sdist, wheel = artifacts(dist, "plugin-api-cpu-arm-acl")
    expect(
        wheel.name.endswith(f"-py3-none-linux_{os.uname().machine}.whl"),
        f"{wheel.name}: not a py3-none-linux wheel",
    )
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        manifest = json.loads(z.read("plugin_api_cpu_arm_acl/_prebuilt/manifest.json"))
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    libraries = sorted(n.rsplit("/", 1)[1] for n in names if n.endswith(".so"))
    wanted = sorted(
        [f"pa_cpu_onednn_{v}.so" for v in manifest["gemm"]]
        + [f"pa_cpu_attn_{v}.so" for v in manifest["attention"]]
    )
    expect(libraries == wanted, f"{wheel.name}: libraries {libraries}, manifest names {wanted}")
    release = torch.__version__.split("+")[0]
    expect(manifest["torch"] == torch.__version__, f"manifest torch {manifest['torch']}")
    expect(
        f"Requires-Dist: torch=={release}" in metadata,
        f"{wheel.name}: no torch=={release} requirement",
    )
    expect("Requires-Dist: ninja" not in metadata, f"{wheel.name}: still requires ninja")
    log(
        f"{wheel.name}: {len(libraries)} prebuilt libraries (GEMM {'/'.join(manifest['gemm'])}, "
        f"attention {'/'.join(manifest['attention'])}), built for torch {manifest['torch']}, "
        f"requires torch=={release}"
    )
    # the sdist builds the same wheel: the backend, setup.py and every C++ source are in it
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    csrc = REPO / NATIVE / "plugin_api_cpu_arm_acl" / "csrc"
    needed = {"setup.py", "wheel_backend.py", "pyproject.toml", "plugin_api_cpu_arm_acl/native.py"}
    needed |= {
        f"plugin_api_cpu_arm_acl/csrc/{p.name}"
        for p in csrc.iterdir()
        if p.suffix in (".cpp", ".h")
    }
    expect(needed <= members, f"{sdist.name} lacks {sorted(needed - members)}")


def torch_spec() -> str:
    """``torch==<release>`` of this interpreter's torch: the release the wheel is built for."""
    import torch

    return f"torch=={torch.__version__.split('+')[0]}"


def make_venv(root: Path, cache: Path, shims: Path, calls: Path) -> Venv:
    subprocess.run([PY, "-m", "venv", str(root)], check=True)
    shims.mkdir()
    for name in COMPILERS:
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\nexit 1\n')
        shim.chmod(0o755)
    keep = ("HOME", "LANG", "TMPDIR", "PIP_CONFIG_FILE", "PIP_FIND_LINKS", "PIP_CERT",
            "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL", "SSL_CERT_FILE",
            "PLUGIN_API_ONEDNN_ROOT")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = os.pathsep.join([str(shims), str(root / "bin"), "/usr/bin", "/bin"])
    # pip's download cache stays where it was: the cache folder watched is the JIT build's
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR") or str(user_cache / "pip")
    env["XDG_CACHE_HOME"] = str(cache)  # where the JIT build would write
    env["TORCH_EXTENSIONS_DIR"] = str(cache / "torch_extensions")
    return Venv(root, env)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def readme_snippet() -> str:
    """The README's "Using the ops" block, as it is there."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Using the ops", 1)[1]
    found = re.search(r"```python[^\n]*\n(.*?)```", section, re.S)
    expect(found is not None, "README.md: no python block under '## Using the ops'")
    assert found is not None
    return found.group(1)


def check_wheels(dist: Path, work: Path, kit: str | None) -> dict[str, float]:
    cache, calls, outside = work / "cache", work / "compiler-calls.log", work / "cwd"
    cache.mkdir()
    outside.mkdir()
    venv = make_venv(work / "venv", cache, work / "shims", calls)
    figures: dict[str, float] = {}
    figures["torch_install_s"] = venv.pip(torch_spec(), cwd=outside)
    log(f"fresh venv {venv.root}: {torch_spec()} installed in {figures['torch_install_s']:.0f} s")
    # our distributions from the wheels only (no index for them, no sdist)
    ours = ["--find-links", str(dist), "--only-binary", ":all:"]

    figures["install_s"] = venv.pip(*ours, "plugin-api-cpu-arm-acl", cwd=outside)
    host = venv.run("python", "-m", "pip", "show", "plugin-api", cwd=outside, check=False)
    expect(host.returncode == 0, "installing plugin-api-cpu-arm-acl alone did not pull plugin-api")
    log(
        "pip install plugin-api-cpu-arm-acl (wheel) alone pulled plugin-api; "
        f"{figures['install_s']:.0f} s"
    )
    names = [
        name for _, name in DISTRIBUTIONS if name not in ("plugin-api", "plugin-api-cpu-arm-acl")
    ]
    venv.pip(*ours, "plugin-api[test]", *names, cwd=outside)
    listed = venv.run("python", "-m", "pip", "list", "--format=json", cwd=outside).stdout
    editable = venv.run(
        "python", "-m", "pip", "list", "--editable", "--format=json", cwd=outside
    ).stdout
    expect(json.loads(editable) == [], f"editable installs in the wheel venv: {editable}")
    versions = {p["name"]: p["version"] for p in json.loads(listed)}
    log(
        "installed from wheels: "
        + ", ".join(f"{n} {versions.get(n, '?')}" for _, n in DISTRIBUTIONS)
    )

    code = "import plugin_api, plugin_api_cpu_arm_acl as p, sys; print(plugin_api.__file__)"
    code += "; print(p.__file__); print(sys.path)"
    where = venv.run("python", "-I", "-c", code, cwd=outside)
    host_file, plugin_file, path = where.stdout.splitlines()[:3]
    site = str(venv.root / "lib")
    expect(
        host_file.startswith(site) and plugin_file.startswith(site),
        f"imported from {host_file}, {plugin_file}",
    )
    expect(str(REPO) not in path, f"the source tree is on sys.path: {path}")
    log(f"plugin_api from {host_file}")

    stderr: dict[str, str] = {}
    first = venv.run("python", "-I", "-", stdin=FIRST_CALL, cwd=outside, backend="cpu-arm-acl")
    stderr["first call"] = first.stderr
    timing = json.loads(first.stdout.splitlines()[-1])
    kinds = {name.split("_")[2] for name in timing["loaded"]}  # pa_cpu_onednn_*, pa_cpu_attn_*
    expect(kinds == {"onednn", "attn"}, f"prebuilt libraries loaded: {timing['loaded']}")
    figures["first_call_s"] = timing["first_call_s"]
    figures["import_s"] = timing["import_s"]
    log(
        f"first prepare + mm + attention after install: {timing['first_call_s']:.2f} s "
        f"(import {timing['import_s']:.2f} s), ran {', '.join(timing['loaded'])}"
    )
    log(
        "pip install of the wheels to the first kernel call: "
        f"{figures['install_s'] + figures['import_s'] + figures['first_call_s']:.1f} s"
    )

    doctor = venv.run("plugin-api", "doctor", cwd=outside)
    stderr["doctor"] = doctor.stderr
    expect("prebuilt for torch" in doctor.stdout, "doctor does not say the kernels are prebuilt")
    log(
        "plugin-api doctor: exit 0; "
        + next(ln.strip() for ln in doctor.stdout.splitlines() if "prebuilt" in ln)
    )
    for backend in (None, "cpu-arm-acl"):  # the selected one (reference here), and the plugin
        snippet = venv.run(
            "python", "-I", "-", stdin=readme_snippet(), cwd=outside, backend=backend
        )
        stderr[f"README snippet on {backend or 'the selected backend'}"] = snippet.stderr
        log(f"README 'Using the ops' block on {backend or 'the selected backend'}: exit 0")
    for backend in ("reference", "cpu-arm-acl"):
        started = time.perf_counter()
        subset = ["-k", kit] if kit else []
        check = venv.run("plugin-api", "check", "--backend", backend, *subset, cwd=outside)
        stderr[f"check {backend}"] = check.stderr
        result = next((ln for ln in check.stdout.splitlines() if ln.startswith("result:")), "?")
        log(
            f"plugin-api check --backend {backend}{f' -k {kit!r}' if kit else ''}: {result} in "
            f"{time.perf_counter() - started:.0f} s"
        )

    # every variant the wheel carries that this CPU runs loads and answers here
    code = "import plugin_api_cpu_arm_acl.prebuilt as p; print(p.MANIFEST.read_text())"
    manifest = json.loads(venv.run("python", "-I", "-c", code, cwd=outside).stdout)
    for kind in ("gemm", "attention"):
        for variant in manifest[kind]:
            one = venv.run("python", "-I", "-", kind, variant, stdin=LOAD_ONE, cwd=outside)
            said = one.stdout.strip()
            loaded = not said.startswith("not loaded")
            log(f"prebuilt {kind} {variant}: {'loads, ' if loaded else ''}{said}")
    compiled = calls.read_text() if calls.exists() else ""
    expect(compiled == "", f"a compiler or ninja ran:\n{compiled}")
    expect(files_under(cache) == [], f"the cache folder is not empty: {files_under(cache)[:10]}")
    log(f"no compiler ran ({', '.join(COMPILERS)} shimmed on PATH) and {cache} stayed empty")
    requires = venv.run("python", "-m", "pip", "show", "plugin-api", cwd=outside).stdout
    if "numpy" in requires.split("Requires:", 1)[1].splitlines()[0]:
        warned = [what for what, err in stderr.items() if "NumPy" in err]
        expect(not warned, f"NumPy warning in the stderr of {warned}")
        log("no NumPy warning in any stderr (the host requires numpy)")
    else:
        log("NumPy warnings not checked: the host does not declare numpy yet")

    refuse_other_torch(venv, outside)
    venv.run("python", "-m", "pip", "uninstall", "-q", "-y", "plugin-api-rocm", cwd=outside)
    listed_after = json.loads(venv.run("plugin-api", "list", "--json", cwd=outside).stdout)
    ids = sorted(p["id"] for p in listed_after["plugins"])
    expect(
        "rocm" not in ids and {"cpu-arm-acl", "xpu", "cuda-sm90"} <= set(ids),
        f"after uninstall: {ids}",
    )
    log(f"pip uninstall plugin-api-rocm: plugin-api list still works: {', '.join(ids)}")
    return figures


def refuse_other_torch(venv: Venv, cwd: Path) -> None:
    """Another torch minor recorded in the installed manifest: the probe refuses, with why."""
    import torch

    found = venv.run(
        "python",
        "-I",
        "-c",
        "import plugin_api_cpu_arm_acl.prebuilt as p; print(p.MANIFEST)",
        cwd=cwd,
    )
    manifest = Path(found.stdout.strip())
    original = manifest.read_text()
    major, minor = torch.__version__.split(".")[:2]
    other = f"{major}.{int(minor) - 1}.0+cpu"
    manifest.write_text(json.dumps(json.loads(original) | {"torch": other}))
    try:
        listed = json.loads(venv.run("plugin-api", "list", "--json", cwd=cwd).stdout)
    finally:
        manifest.write_text(original)
    entry = next(p for p in listed["plugins"] if p["id"] == "cpu-arm-acl")
    reason = " ".join(entry["reasons"])
    expect(
        entry["state"] == "unavailable",
        f"cpu-arm-acl is {entry['state']} with torch {other} recorded",
    )
    expect(f"built for torch {other}, found {torch.__version__}" in reason, f"reason: {reason}")
    log(f"manifest edited to torch {other}: cpu-arm-acl unavailable: {entry['reasons'][0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--dist", type=Path, help="where the sdists and wheels go (default: a temporary folder)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary venv and files")
    parser.add_argument(
        "--kit",
        metavar="EXPR",
        help="plugin-api check runs only the kit cases matching EXPR (its -k); default all",
    )
    args = parser.parse_args()
    machine = os.uname().machine
    if machine != "x86_64" and not os.environ.get("PLUGIN_API_ONEDNN_ROOT"):
        # oneDNN's PyPI wheels are x86_64 only; elsewhere the native build needs a oneDNN
        log(
            f"skipped on {machine}: the cpu-arm-acl wheel compiles against oneDNN, which has no "
            "PyPI wheel here; set PLUGIN_API_ONEDNN_ROOT to a oneDNN build "
            "(plugins/cpu-arm-acl/README.md) to check the wheels on this machine"
        )
        return 0
    work = Path(tempfile.mkdtemp(prefix="plugin-api-wheels-"))
    dist = args.dist or work / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    for _, name in DISTRIBUTIONS:  # an earlier run's, so that each name has one of each
        for old in [
            *dist.glob(f"{name.replace('-', '_')}-*.whl"),
            *dist.glob(f"{name.replace('-', '_')}-*.tar.gz"),
        ]:
            old.unlink()
    started = time.perf_counter()
    try:
        build = build_all(dist)
        check_native_wheel(dist)
        figures = check_wheels(dist, work, args.kit)
    except CheckFailed as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    log(
        f"PASS in {time.perf_counter() - started:.0f} s (builds {sum(build.values()):.0f} s, "
        f"first kernel call {figures['first_call_s']:.2f} s after install)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
