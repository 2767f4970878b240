"""The second example of docs/writing-a-plugin.md, built from the page's code blocks alone.

Every block of the page flagged ``plugin=PATH`` is the whole file PATH of the ``example-eager``
plugin. The blocks are written to a folder, the folder is installed with pip like any plugin,
and the conformance kit runs against it: it must pass with the example's own attention, GEMM and
state code running, and the specs its attention refuses skipped with the reasons it gives. As the
page says, a non-finite value in a key that a query cannot see never reaches its output.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath

import pytest

from ci.docblocks import blocks

from .test_example_plugin import pip_install, run

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-a-plugin.md"
FLAG = "plugin="
BACKEND = "example-eager"
PACKAGE = "plugin_api_example_eager"
FAMILIES = ("attention", "gemm", "state")


def guide_files() -> dict[str, str]:
    """``{PATH: text}`` for the guide's blocks flagged ``plugin=PATH``."""
    files: dict[str, str] = {}
    for b in blocks(GUIDE):
        for flag in (f for f in b.flags if f.startswith(FLAG)):
            path = PurePosixPath(flag.removeprefix(FLAG))
            where = f"{GUIDE.name}:{b.line}"
            inside = path.parts and not path.is_absolute() and ".." not in path.parts
            assert inside, f"{where}: {flag} is not a path inside the plugin's folder"
            assert str(path) not in files, f"{where}: a second block for {path}"
            files[str(path)] = b.text
    return files


def test_the_guide_writes_out_a_whole_plugin() -> None:
    modules = ("__init__", "descriptor", "probe", "hooks", *FAMILIES)
    expected = {"pyproject.toml"} | {f"{PACKAGE}/{m}.py" for m in modules}
    assert set(guide_files()) == expected


@pytest.fixture(scope="module")
def guide_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's plugin, written from its blocks and installed by pip into a fresh folder."""
    src = tmp_path_factory.mktemp("guide-src") / "plugin-api-example-eager"
    for rel, text in guide_files().items():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
    site = tmp_path_factory.mktemp("guide-site")
    pip_install(src, site)
    return site


def test_plugin_api_list_shows_it_usable(guide_site: Path) -> None:
    r = run(guide_site, "-m", "plugin_api", "list", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = [p for p in json.loads(r.stdout)["plugins"] if p["id"] == BACKEND]
    assert rec["state"] == "experimental", rec
    assert rec["distribution"] == "plugin-api-example-eager"
    assert rec["families"] == list(FAMILIES)


def test_the_kit_passes_running_its_own_code(guide_site: Path, tmp_path: Path) -> None:
    r = run(guide_site, "-m", "pytest", f"--plugin-api-backend={BACKEND}", "-q", "-rs",
            "-p", "no:cacheprovider", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    summary = r.stdout.split(f"plugin-api conformance: {BACKEND}", 1)[1]
    for family in FAMILIES:
        ran = re.search(rf"^{family}\s+torch:{BACKEND}:{family} x(\d+)$", summary, re.M)
        assert ran and int(ran[1]) > 0, f"the example's own {family} code must run:\n{summary}"
    assert "only fallbacks ran" not in summary
    # what its attention refuses is skipped with the reasons its supports gives
    reasons = set(re.findall(rf"rejected by {BACKEND}: (.+)$", r.stdout, re.M))
    assert any("has_sinks" in x for x in reasons), reasons
    assert any("kv_cache_dtype=fp8" in x for x in reasons), reasons
    rejected = re.search(r"^attention\s+(\d+) case\(s\) rejected by the backend", summary, re.M)
    assert rejected and int(rejected[1]) > 0, summary


MASKED = f"""
import plugin_api as pa
from masked_values import poisoned_case, run_and_check, specs

served = []
for name, spec in specs().items():
    attn = pa.attention(spec, pa.backend_for({BACKEND!r}))
    if not attn.provenance.fallback:
        run_and_check(attn, poisoned_case(spec, "cpu"))
        served.append(name)
print(len(served))
"""


def test_masked_non_finite_keys_do_not_reach_its_output(guide_site: Path) -> None:
    """The cases of ``tests/test_masked_nonfinite.py``, run on the page's attention."""
    path = os.pathsep.join([str(guide_site), str(ROOT / "tests")])
    r = run(guide_site, "-W", "ignore", "-c", MASKED, env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 0, "the example serves none of the poisoned specs"
