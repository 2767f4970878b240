"""What the conformance kit says about a backend, run as a CI job runs it: ``pytest
--plugin-api-backend=ID`` and ``plugin-api check --backend ID`` in fresh processes, against
plugins installed as real distributions (``tests/distributions.py``).

- A backend the kit cannot check (not installed, failed its host-API check, claimed by two
  distributions, unavailable here) stops both with exit 4 and one line naming the cause; only
  ``--plugin-api-skip-unavailable`` turns "unavailable here" into a skip.
- A GEMM kernel that is wrong only past 64 rows fails the kit's M bands, with the seed.
- A CUDA-graph level above NEVER on a CPU device is a meaningless claim, for doctor and the kit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_api.conformance.graph_claims import meaningless_graph_claim
from plugin_api.conformance.plugin import BACKEND_UNUSABLE
from plugin_api.conformance.test_gemm import M_BANDS, band_cases
from plugin_api.contract.graphs import GraphLevel, GraphSupport

from .distributions import write_plugin


def run(*args: str, site: Path | None, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python args`` with only ``site`` added to the path, from ``cwd`` (no repository ini)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    if site is not None:
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), base.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=base | env,
        cwd=cwd,
        timeout=600,
    )


def kit(backend: str, *args: str, site: Path | None, cwd: Path, **env: str):
    return run(
        "-m", "pytest", f"--plugin-api-backend={backend}", "-q", "-p", "no:cacheprovider", *args,
        site=site, cwd=cwd, **env,
    )  # fmt: skip


def check(backend: str, *, site: Path | None, cwd: Path, **env: str):
    return run("-m", "plugin_api", "check", "--backend", backend, site=site, cwd=cwd, **env)


# ---- a backend the kit cannot check ---------------------------------------------------------


def _not_installed(site: Path) -> tuple[str, str]:
    return "refrence", "backend 'refrence' is not installed (installed: "


def _host_api(site: Path) -> tuple[str, str]:
    write_plugin(
        site, dist="fx-future", backend_id="fx-future", package="fx_future", host_api=">=2.0,<3"
    )
    return "fx-future", "backend 'fx-future' failed to load at compat: plugin 'fx-future' supports"


def _claimed_twice(site: Path) -> tuple[str, str]:
    write_plugin(site, dist="fx-one", backend_id="fx-twice", package="fx_one")
    write_plugin(site, dist="fx-two", backend_id="fx-twice", package="fx_two")
    return "fx-twice", "backend 'fx-twice' is not loaded: backend id 'fx-twice' is claimed by 2"


def _unavailable(site: Path) -> tuple[str, str]:
    write_plugin(
        site, dist="fx-away", backend_id="fx-away", package="fx_away", status="unavailable"
    )
    return "fx-away", "backend 'fx-away' is unavailable on this machine: fixture says unavailable"


UNUSABLE = {
    "not-installed": _not_installed,
    "host-api": _host_api,
    "claimed-twice": _claimed_twice,
    "unavailable": _unavailable,
}


@pytest.mark.parametrize("cause", list(UNUSABLE))
def test_a_backend_the_kit_cannot_check_fails_both_ways_with_one_line(
    tmp_path: Path, cause: str
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    backend, message = UNUSABLE[cause](site)
    r = kit(backend, site=site, cwd=tmp_path)
    assert r.returncode == BACKEND_UNUSABLE == 4, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if message in ln]
    assert len(lines) == 1 and lines[0].startswith("ERROR: plugin-api conformance kit: "), (
        r.stdout[-2000:] + r.stderr[-2000:]
    )
    assert "passed" not in r.stdout and "skipped" not in r.stdout  # no test ran at all
    c = check(backend, site=site, cwd=tmp_path)
    assert c.returncode == r.returncode, c.stdout[-2000:] + c.stderr[-2000:]
    assert c.stderr.strip().splitlines() == [
        "plugin-api check: error: " + lines[0].removeprefix("ERROR: plugin-api conformance kit: ")
    ]


def test_the_misspelt_id_gets_a_suggestion(tmp_path: Path) -> None:
    r = kit("refrence", site=None, cwd=tmp_path)
    assert r.returncode == 4 and "did you mean 'reference'?" in r.stderr, r.stderr


def test_unavailable_here_skips_only_behind_the_option(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    backend, message = _unavailable(site)
    r = kit(backend, "--plugin-api-skip-unavailable", "-rs", site=site, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"^\d+ skipped in ", r.stdout, re.M), r.stdout[-1000:]
    assert message in r.stdout and "no op ran: every test was skipped" in r.stdout
    # the option never hides a backend that is not there at all
    backend, message = _host_api(site)
    r = kit(backend, "--plugin-api-skip-unavailable", site=site, cwd=tmp_path)
    assert r.returncode == 4 and message in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


# ---- GEMM M bands ---------------------------------------------------------------------------

# A GEMM that is exact for the first 64 rows and never writes the rows past them: the bug of a
# kernel whose row loop stops after one tile. Every fixed shape of the kit has M <= 64.
FIRST_TILE_DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api=">=1.0,<2", priority=1, families=("gemm",), device_kinds=("cpu",),
    hooks={hooks!r}, summary="test fixture: a GEMM wrong past 64 rows",
)
"""
FIRST_TILE_HOOKS = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import ImplPath
from plugin_api.reference.gemm import ReferenceGemm

TILE = 64


class FirstTileOnly(ReferenceGemm):
    name = "{id}:first-tile"
    path = ImplPath.TORCH

    def mm(self, spec, x, payload, bias, out):
        rows = min(x.shape[0], TILE)
        super().mm(spec, x[:rows], payload, bias, out[:rows])

    def scaled_mm(self, spec, x_q, x_scale, payload, bias, out):
        rows = min(x_q.shape[0], TILE)
        super().scaled_mm(spec, x_q[:rows], x_scale[:rows], payload, bias, out[:rows])


@hookimpl
def plugin_api_probe(info):
    return Availability.experimental("cpu", "test fixture")


@hookimpl
def plugin_api_implementations(family):
    return (FirstTileOnly(),)
"""
FIRST_TILE = {"descriptor": FIRST_TILE_DESCRIPTOR, "hooks": FIRST_TILE_HOOKS}


def test_the_m_bands_cover_every_small_m_and_each_side_of_the_edges() -> None:
    assert set(range(1, 17)) <= set(M_BANDS)
    for edge in (32, 64, 128, 256, 512, 24, 48, 96, 192, 384):
        assert {edge - 1, edge, edge + 1} <= set(M_BANDS)
    assert max(M_BANDS) > 512
    cases = band_cases(7, 1, ["a", "b"], salt="x")
    assert [c.m for c in cases] == list(M_BANDS)  # every band value in every run
    assert cases == band_cases(7, 1, ["a", "b"], salt="x")  # the seed repeats the sample
    assert cases != band_cases(8, 1, ["a", "b"], salt="x")
    assert max(c.n for c in band_cases(7, 4, ["a"], salt="x")) >= 2048


def test_a_gemm_wrong_past_64_rows_fails_the_bands_with_its_seed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(site, dist="fx-tile", backend_id="fx-tile", package="fx_tile", **FIRST_TILE)
    fixed = kit(
        "fx-tile", "-k", "(test_mm or test_scaled_mm) and not bands", site=site, cwd=tmp_path
    )
    assert fixed.returncode == 0, fixed.stdout[-3000:]  # the fixed shapes never see the bug
    r = kit("fx-tile", "-k", "test_mm or test_scaled_mm", site=site, cwd=tmp_path)
    out = r.stdout
    assert r.returncode == 1, out[-3000:] + r.stderr[-2000:]
    failed = re.findall(r"^FAILED \S+::(test_\w+)\[(\d+)x", out, re.M)
    assert failed and {int(m) for _, m in failed} == {m for m in M_BANDS if m > 64}, failed
    assert {t for t, _ in failed} == {"test_mm_bands", "test_scaled_mm_bands"}
    seed = re.search(r"^gemm +\d+ sampled case\(s\) failed: --plugin-api-seed=(\d+) ", out, re.M)
    assert seed, out[-3000:]
    assert f"rerun with --plugin-api-seed={seed[1]} to repeat" in out  # in each failure too
    # the seed repeats the sample, and plugin-api check agrees: exit 1, the same failures
    c = run("-m", "plugin_api", "check", "--json", "--backend", "fx-tile", "--seed", seed[1],
            site=site, cwd=tmp_path)  # fmt: skip
    assert c.returncode == 1, c.stdout[-3000:] + c.stderr[-2000:]
    data = json.loads(c.stdout)
    assert data["seed"] == int(seed[1]) and data["exit_code"] == 1
    ids = re.findall(r"^FAILED (\S+)", out, re.M)
    assert sorted(f["test"].split("::")[-1] for f in data["failures"]) == sorted(
        i.split("::")[-1] for i in ids
    )


# ---- CUDA-graph claims ----------------------------------------------------------------------

CLAIMS_DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api=">=1.0,<2", priority=1, families=("attention",), device_kinds=("cpu",),
    hooks={hooks!r}, summary="test fixture: claims CUDA graphs on the CPU",
)
"""
CLAIMS_HOOKS = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import ImplPath
from plugin_api.contract.graphs import GraphLevel, GraphSupport
from plugin_api.reference.attention import ReferenceAttention


class ClaimsGraphs(ReferenceAttention):
    name = "{id}:claims-graphs"
    path = ImplPath.TORCH

    def graph_support(self, spec, info):
        return GraphSupport(GraphLevel.UNIFORM_BATCH, "plans refill fixed buffers")


@hookimpl
def plugin_api_probe(info):
    return Availability.experimental("cpu", "test fixture")


@hookimpl
def plugin_api_implementations(family):
    return (ClaimsGraphs(),)
"""


@pytest.fixture
def claims_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(
        site,
        dist="fx-claims",
        backend_id="fx-claims",
        package="fx_claims",
        descriptor=CLAIMS_DESCRIPTOR,
        hooks=CLAIMS_HOOKS,
    )
    return site


def test_graph_claims_are_judged_by_the_device() -> None:
    batch = GraphSupport(GraphLevel.UNIFORM_BATCH, "r")
    assert meaningless_graph_claim("cuda", batch) is None
    assert meaningless_graph_claim("xpu", GraphSupport(GraphLevel.ALWAYS, "r")) is None
    assert meaningless_graph_claim("cpu", GraphSupport(GraphLevel.NEVER, "r")) is None
    problem = meaningless_graph_claim("cpu", batch)
    assert problem and problem.startswith("meaningless claim: UNIFORM_BATCH on a cpu device")


def test_doctor_reports_a_graph_level_on_the_cpu_as_meaningless(
    claims_site: Path, tmp_path: Path
) -> None:
    r = run("-m", "plugin_api", "doctor", "--json", site=claims_site, cwd=tmp_path,
            PLUGIN_API_BACKEND="fx-claims")  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    graphs = [layer["graph"] for m in data["ops"] for layer in m["layers"] if "graph" in layer]
    assert graphs and all(g["level"] == "UNIFORM_BATCH" for g in graphs)
    assert all(g["problem"].startswith("meaningless claim: UNIFORM_BATCH on a cpu") for g in graphs)
    text = run("-m", "plugin_api", "doctor", site=claims_site, cwd=tmp_path,
               PLUGIN_API_BACKEND="fx-claims").stdout  # fmt: skip
    assert "      ! meaningless claim: UNIFORM_BATCH on a cpu device" in text
    # a NEVER on the CPU (the reference) is an honest answer, not a problem
    ref = json.loads(run("-m", "plugin_api", "doctor", "--json", site=None, cwd=tmp_path).stdout)
    assert not [
        layer for m in ref["ops"] for layer in m["layers"] if "problem" in layer.get("graph", {})
    ]


def test_the_kit_fails_a_graph_level_on_the_cpu(claims_site: Path, tmp_path: Path) -> None:
    r = kit("fx-claims", "-k", "test_graph_support_is_declared", site=claims_site, cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:]
    assert "meaningless claim: UNIFORM_BATCH on a cpu device" in r.stdout, r.stdout[-3000:]
    assert not re.search(r"\d+ passed", r.stdout), r.stdout[-1000:]  # every feature fails


# ---- a kernel that writes into its input --------------------------------------------------------

SCRIBBLER_DESCRIPTOR = """
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={id!r}, host_api=">=1.0,<2", priority=1, families=("gemm", "quant"),
    device_kinds=("cpu",), hooks={hooks!r}, summary="test fixture: kernels that scribble on x",
)
"""
SCRIBBLER_HOOKS = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import ImplPath
from plugin_api.reference.gemm import ReferenceGemm
from plugin_api.reference.quant import ReferenceQuant


class ScribblingGemm(ReferenceGemm):
    name = "{id}:gemm"
    path = ImplPath.TORCH

    def mm(self, spec, x, payload, bias, out):
        super().mm(spec, x, payload, bias, out)  # right answer, then the input is scribbled on
        x[0, 0] = x[0, 0] * 2 + 1


class ScribblingQuant(ReferenceQuant):
    name = "{id}:quant"
    path = ImplPath.TORCH

    def quantize(self, spec, x, eps, out_q, out_scales):
        super().quantize(spec, x, eps, out_q, out_scales)
        x[-1].zero_()


@hookimpl
def plugin_api_probe(info):
    return Availability.experimental("cpu", "test fixture")


@hookimpl
def plugin_api_implementations(family):
    return (ScribblingGemm(),) if family.value == "gemm" else (ScribblingQuant(),)
"""


def test_a_kernel_that_writes_into_its_input_fails_naming_it(tmp_path: Path) -> None:
    """Its outputs are right, so only the input check can catch it: by name, not 'not close'."""
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(
        site, dist="fx-scribble", backend_id="fx-scribble", package="fx_scribble",
        descriptor=SCRIBBLER_DESCRIPTOR, hooks=SCRIBBLER_HOOKS,
    )  # fmt: skip
    select = "test_mm and not bands or test_group_quant"
    r = kit("fx-scribble", "-k", select, "--tb=line", site=site, cwd=tmp_path)
    out = r.stdout
    assert r.returncode == 1, out[-3000:] + r.stderr[-2000:]
    tests = set(re.findall(r"^FAILED \S+::(test_\w+)\[", out, re.M))
    assert "test_mm" in tests and "test_group_quant_bit_exact" in tests, out[-3000:]
    why = set(re.findall(r"^\S+:\d+: (\w+: .*)$", out, re.M))  # --tb=line: one per failure
    assert why == {"AssertionError: backend 'fx-scribble' modified its input x"}, why
