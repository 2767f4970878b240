"""The docs are checked like code: ``docs/checks.py`` over the real tree, proof that every check
fails on a planted mistake, and the runnable shell blocks run against stub CLIs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from . import doc_stubs

ROOT = Path(__file__).resolve().parent.parent
NEBIUS = ROOT / "docs" / "deploy" / "nebius-serverless.md"


def _load_checks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plugin_api_doc_checks", ROOT / "docs/checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checks = _load_checks()


# ---- the real docs -------------------------------------------------------------------------------


def test_the_docs_pass_every_check():
    findings = checks.check_tree(ROOT)
    assert findings == [], "\n".join(map(str, findings))


def test_the_checks_see_the_docs():
    files = {p.relative_to(ROOT).as_posix() for p in checks.doc_files(ROOT)}
    assert {"README.md", "docs/writing-a-plugin.md", "docs/deploy/nebius-serverless.md"} <= files
    shell = [b for p in checks.doc_files(ROOT) for b in checks.blocks(p) if b.shell]
    runnable_py = [
        b
        for p in checks.doc_files(ROOT)
        for b in checks.blocks(p)
        if b.lang == "python" and "runnable" in b.flags
    ]
    assert len(shell) >= 15 and len(runnable_py) >= 3


# ---- planted mistakes ----------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Callable[[str, str], Path]:
    """A throwaway repository root: a pyproject for plugin-api 0.1.0, plus the files written."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "plugin-api"\nversion = "0.1.0"\n')
    (tmp_path / "docs").mkdir()

    def write(rel: str, text: str) -> Path:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return tmp_path

    return write


def found(root: Path, **kw) -> list[tuple[str, int, str]]:
    return [(f.path, f.line, f.check) for f in checks.check_tree(root, allow=kw.pop("allow", ()))]


def test_a_clean_planted_doc_passes(tree):
    root = tree(
        "docs/a.md",
        """\
        # A heading

        ```bash
        name="$(hostname)"
        echo "hello $name"
        ```

        [self](#a-heading) [other](b.md) [web](https://example.com/x)
        """,
    )
    tree("docs/b.md", "# B\n")
    assert found(root) == []


def test_broken_snippet_fails_bash_n(tree):
    root = tree("docs/a.md", "# A\n\n```bash\nif true; then\n  echo yes\n```\n")
    assert found(root) == [("docs/a.md", 4, "syntax")]


def test_broken_console_snippet_fails_and_output_is_ignored(tree):
    text = '```console\n$ echo "unclosed\nsome output (here\n```\n'
    root = tree("docs/a.md", text)
    assert [c for _, _, c in found(root)] == ["syntax"]
    root = tree("docs/a.md", "```console\n$ echo ok\nsome output (here\n```\n")
    assert found(root) == []


def test_shellcheck_findings_and_the_allow_list(tree):
    root = tree("docs/a.md", "```bash\necho $missing\n```\n")
    assert sorted(found(root)) == [("docs/a.md", 2, "shellcheck")] * 2  # SC2086, SC2154
    allow = (
        checks.Allow("docs/a.md", "SC2086", "test"),
        checks.Allow("docs/a.md", "SC2154", "test"),
    )
    assert found(root, allow=allow) == []
    stale = (*allow, checks.Allow("docs/a.md", "SC2034", "suppresses nothing"))
    assert found(root, allow=stale) == [("docs/a.md", 1, "allow-list")]


def test_blocks_of_one_file_are_one_script(tree):
    """A variable set in one block and used in a later one is fine (the reader's shell)."""
    root = tree("docs/a.md", '```bash\nthing=1\n```\n\ntext\n\n```sh\necho "$thing"\n```\n')
    assert found(root) == []


def test_shell_files_under_docs_are_checked(tree):
    root = tree("docs/job.sh", '#!/usr/bin/env bash\nfor x in 1 2; do\n  echo "$x"\n')
    assert found(root) == [("docs/job.sh", 1, "syntax")]


def test_malformed_digest_fails(tree):
    bad = "sha256:" + "a" * 63
    root = tree(
        "docs/deploy/guide.md",
        f"""\
        ```bash pins
        IMAGE_DIGEST="{bad}"
        ```

        ```bash
        echo "image@$IMAGE_DIGEST"
        ```
        """,
    )
    assert sorted(found(root)) == [
        ("docs/deploy/guide.md", 2, "digest"),
        ("docs/deploy/guide.md", 2, "pins"),
    ]


def test_malformed_digest_in_prose_fails(tree):
    root = tree("docs/a.md", "The image is `repo@sha256:ABCDEF` for now.\n")
    assert found(root) == [("docs/a.md", 1, "digest")]


@pytest.mark.parametrize(
    "pin, ok",
    [
        ("MODEL_REVISION=" + "c" * 40, True),
        ("MODEL_REVISION=main", False),
        ('PLUGIN_API_VERSION="0.1.0"', True),
        ('PLUGIN_API_VERSION="0.2.0"', False),  # not the repository's pyproject version
        ('TOOL_VERSION="1.2.3"', True),
        ('TOOL_VERSION="latest"', False),
        ('TOOL_VERSION="v1.2"', False),
        ("echo not-a-pin", False),
    ],
)
def test_pin_formats(tree, pin, ok):
    name = pin.split("=")[0] if "=" in pin else "X"
    root = tree("docs/a.md", f'```bash pins\n{pin}\n```\n\n```bash\necho "${name}"\n```\n')
    assert (found(root) == []) is ok, found(root)


def test_pins_are_used_and_never_repeated(tree):
    root = tree(
        "docs/a.md",
        """\
        ```bash pins
        GPU_PRESET="1gpu-16vcpu-200gb"
        UNUSED_THING="something-long"
        ```

        ```bash
        echo "--preset $GPU_PRESET"
        echo --preset 1gpu-16vcpu-200gb
        ```
        """,
    )
    assert sorted(found(root)) == [
        ("docs/a.md", 3, "pins"),  # UNUSED_THING is not used
        ("docs/a.md", 3, "shellcheck"),  # SC2034, the same from shellcheck
        ("docs/a.md", 6, "pins"),  # the preset's value repeated
    ]


def test_a_deployment_guide_has_exactly_one_pins_block(tree):
    root = tree("docs/deploy/guide.md", "```bash\necho hi\n```\n")
    assert found(root) == [("docs/deploy/guide.md", 1, "pins")]


def test_dead_links_fail(tree):
    root = tree(
        "docs/a.md",
        """\
        # Title

        [gone](missing.md) [bad anchor](b.md#nowhere) [ok](b.md#real-heading)
        ![img](img/none.png) [self](#title) [self bad](#untitled)
        """,
    )
    tree("docs/b.md", "# Real heading\n")
    assert sorted(found(root)) == [("docs/a.md", 3, "link")] * 2 + [("docs/a.md", 4, "link")] * 2


def test_python_blocks_compile_and_runnable_ones_run(tree):
    root = tree("docs/a.md", "```python\ndef f(:\n    pass\n```\n")
    assert [c for _, _, c in found(root)] == ["python"]
    root = tree("docs/a.md", "```python\nraise SystemExit(3)  # compiled, not run\n```\n")
    assert found(root) == []
    root = tree("docs/a.md", "```python runnable\nassert 1 + 1 == 3, 'arithmetic'\n```\n")
    assert found(root) == [("docs/a.md", 1, "python")]


def test_quoted_excerpts_match_their_file(tree):
    tree("src/mod.py", "def f():\n    return 1\n")
    root = tree("docs/a.md", "```python file=src/mod.py\ndef f():\n    return 1\n```\n")
    assert found(root) == []
    root = tree("docs/a.md", "```python file=src/mod.py\ndef f():\n    return 2\n```\n")
    assert found(root) == [("docs/a.md", 1, "excerpt")]


# ---- running the shell blocks --------------------------------------------------------------------


def nebius_pins() -> dict[str, str]:
    block = next(b for b in checks.blocks(NEBIUS) if "pins" in b.flags)
    pins, bad = checks.parse_pins("nebius", block)
    assert bad == []
    return {k: v for k, (_, v) in pins.items()}


PUBLISHED = {"IMAGE_DIGEST_IS_PLACEHOLDER": "0"}  # as if CI had published the pinned image


@pytest.fixture
def run_doc(tmp_path: Path):
    """Run a doc's runnable blocks with stub CLIs; returns (process, calls, stub state dir)."""

    def run(doc: Path, scenario: str = "pass", pins: dict[str, str] | None = None, **extra: str):
        state = tmp_path / "state"
        env = {
            "STUB_STATE": str(state),
            "STUB_SCENARIO": scenario,
            "STUB_CONTAINER_BIN": str(
                doc_stubs.install(tmp_path / "container-bin", doc_stubs.CONTAINER_TOOLS)
            ),
            "POLL_SECONDS": "0",
            "BUCKET": "stub-bucket",
            "S3_ENDPOINT": "https://storage.stub.example",
            **extra,
        }
        stubs = doc_stubs.install(tmp_path / "bin", doc_stubs.HOST_TOOLS)
        work = tmp_path / "work"
        work.mkdir()
        r = checks.run_shell(ROOT, doc, stubs=stubs, env=env, pins=pins, workdir=work)
        return r, doc_stubs.calls(state), state, work

    return run


RUN_WITH = {NEBIUS: PUBLISHED}


@pytest.mark.parametrize(
    "doc",
    [p for p in checks.doc_files(ROOT) if checks.runnable_shell(p)],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_runnable_shell_blocks_run(run_doc, doc):
    r, *_ = run_doc(doc, pins=RUN_WITH.get(doc))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def nebius_calls(calls: list[dict], *verb: str) -> list[list[str]]:
    n = len(verb)
    return [c["argv"][n:] for c in calls if c["tool"] == "nebius" and c["argv"][:n] == list(verb)]


def flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]


def test_nebius_guide_end_to_end(run_doc):
    r, calls, state, work = run_doc(NEBIUS, pins=PUBLISHED)
    assert r.returncode == 0, r.stderr[-2000:]
    pins = nebius_pins()
    creates = nebius_calls(calls, "ai", "job", "create")
    assert len(creates) == 2 and creates[0][-1] == "--dry-run" and creates[1][-1] == "--async"
    assert creates[0][:-1] == creates[1][:-1], "the dry run must validate the same request"
    create = creates[1]
    assert flag(create, "--image") == [f"{pins['IMAGE_REPO']}@{pins['IMAGE_DIGEST']}"]
    assert flag(create, "--platform") == [pins["GPU_PLATFORM"]]
    assert flag(create, "--preset") == [pins["GPU_PRESET"]]
    assert flag(create, "--timeout") == [pins["JOB_TIMEOUT"]]
    assert f"EXPECT_PLUGIN_API_VERSION={pins['PLUGIN_API_VERSION']}" in flag(create, "--env")
    # The ID is looked up by name after the create, and every later call uses that ID.
    jobs = json.loads((state / "nebius.json").read_text())["jobs"]
    assert jobs == {}, "the guide ends by deleting the job"
    names = [c["argv"] for c in calls if c["tool"] == "nebius"]
    first_lookup = next(i for i, a in enumerate(names) if a[2:3] == ["get-by-name"])
    assert first_lookup > next(i for i, a in enumerate(names) if a[-1:] == ["--async"])
    used = {a[a.index("--id") + 1] for a in names if "--id" in a}
    used |= {a[3] for a in names if a[2:3] == ["logs"]}
    assert used == {"aijob-e00stub0001"}
    # Results came home, and the job was deleted only after that.
    order = [c["tool"] + ":" + " ".join(c["argv"][:3]) for c in calls]
    assert order.index(
        "aws:s3 cp s3://stub-bucket/" + flag(create, "--name")[0] + "/"
    ) < order.index("nebius:ai job delete")
    results = next((work / "plugin-api-results").iterdir())
    summary = json.loads((results / "summary.json").read_text())
    assert summary["status"] == "passed" and summary["ready"]["gpu"] == "NVIDIA H200"
    assert {p.name for p in results.iterdir()} >= {"doctor.json", "kit.xml", "bench.json"}


def test_nebius_guide_refuses_the_placeholder_image(run_doc):
    r, calls, *_ = run_doc(NEBIUS)  # the pins as committed
    assert r.returncode != 0
    assert "IMAGE_DIGEST is the placeholder" in r.stderr
    assert nebius_calls(calls, "ai", "job", "create") == []


def test_nebius_guide_waits_a_bounded_time_for_the_report(run_doc):
    r, calls, *_ = run_doc(NEBIUS, "no-pull", PUBLISHED, READY_POLLS="6")
    assert r.returncode != 0
    assert "(STARTING) did not report ready in 6 polls" in r.stderr
    assert len(nebius_calls(calls, "ai", "job", "logs")) == 6


def test_nebius_guide_stops_when_the_backend_is_unavailable(run_doc):
    r, calls, state, _ = run_doc(NEBIUS, "unavailable", PUBLISHED)
    assert r.returncode != 0 and "is FAILED and never reported ready" in r.stderr
    assert not any(c["tool"] in ("pytest", "aws") for c in calls), "no kit, nothing collected"
    summary = next((state / "buckets").rglob("summary.json"))
    assert "unavailable here" in json.loads(summary.read_text())["ready"]["problems"][0]


def test_nebius_guide_stops_before_the_kit_on_another_image(run_doc):
    r, calls, state, _ = run_doc(NEBIUS, "old-image", PUBLISHED)
    assert r.returncode != 0
    assert not any(c["tool"] == "pytest" for c in calls)
    problems = json.loads(next((state / "buckets").rglob("summary.json")).read_text())
    assert "plugin-api 0.0.9 in the image, the guide pins 0.1.0" in problems["ready"]["problems"]


def test_nebius_guide_reports_a_failing_kit_and_keeps_the_job(run_doc):
    r, calls, _, work = run_doc(NEBIUS, "kit-fails", PUBLISHED)
    assert r.returncode != 0
    summary = json.loads(next((work / "plugin-api-results").rglob("summary.json")).read_text())
    assert summary["status"] == "failed" and summary["steps"]["kit"] == 1
    assert nebius_calls(calls, "ai", "job", "delete") == [], "logs are kept for the failure"


def test_nebius_placeholder_digest_is_the_documented_one():
    pins = nebius_pins()
    text = NEBIUS.read_text()
    sentence = re.search(r"printf '%s' '([^']+)' \| sha256sum", text)
    assert sentence is not None
    if pins["IMAGE_DIGEST_IS_PLACEHOLDER"] == "1":
        digest = hashlib.sha256(sentence[1].encode()).hexdigest()
        assert pins["IMAGE_DIGEST"] == f"sha256:{digest}"


def test_the_job_script_fits_an_injected_file():
    assert (ROOT / "docs/deploy/nebius-validate.sh").stat().st_size < 64 * 1024


def test_the_stub_doctor_reads_fields_the_real_doctor_has():
    """nebius-validate.sh reads these fields; the real report must have them."""
    r = subprocess.run(
        [sys.executable, "-m", "plugin_api", "doctor", "--json", "--device-info", "h200"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    real = json.loads(r.stdout)
    stub, _ = doc_stubs.doctor("pass")
    assert set(stub["host"]) <= set(real["host"])
    assert set(stub["selection"]) <= set(real["selection"])
    assert set(stub["plugins"][0]) <= set(real["plugins"][0])
    assert set(stub["device_info"]["accelerators"][0]) <= set(
        real["device_info"]["accelerators"][0]
    )
