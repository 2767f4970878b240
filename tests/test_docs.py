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
NEBIUS = ROOT / "docs" / "deploy" / "nebius-serverless.md"  # serving: a vLLM endpoint
NEBIUS_JOB = ROOT / "docs" / "deploy" / "nebius-validate-job.md"  # validation: a job


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
    assert {
        "README.md",
        "docs/writing-a-plugin.md",
        "docs/deploy/nebius-serverless.md",
        "docs/deploy/nebius-validate-job.md",
    } <= files
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


def guide_pins(doc: Path) -> dict[str, str]:
    block = next(b for b in checks.blocks(doc) if "pins" in b.flags)
    pins, bad = checks.parse_pins(doc.name, block)
    assert bad == []
    return {k: v for k, (_, v) in pins.items()}


PUBLISHED = {"IMAGE_DIGEST_IS_PLACEHOLDER": "0"}  # as if CI had published the pinned image


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, trusted by the runs (curl and Python)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def run_doc(tmp_path: Path, tls: tuple[Path, Path]):
    """Run a doc's runnable blocks with stub CLIs and a fake endpoint behind the stub's URL;
    returns (process, calls, stub state dir, work dir, fake endpoint)."""

    def run(doc: Path, scenario: str = "pass", pins: dict[str, str] | None = None, **extra: str):
        state = tmp_path / "state"
        cert, key = tls
        with doc_stubs.FakeEndpoint(state, scenario, cert, key) as endpoint:
            env = {
                "STUB_STATE": str(state),
                "STUB_SCENARIO": scenario,
                "STUB_CONTAINER_BIN": str(
                    doc_stubs.install(tmp_path / "container-bin", doc_stubs.CONTAINER_TOOLS)
                ),
                "STUB_ENDPOINT_URL": endpoint.url,
                "SSL_CERT_FILE": str(cert),  # Python's urllib (the readiness tool)
                "CURL_CA_BUNDLE": str(cert),
                "POLL_SECONDS": "0",
                "BUCKET": "stub-bucket",
                "S3_ENDPOINT": "https://storage.stub.example",
                **extra,
            }
            stubs = doc_stubs.install(tmp_path / "bin", doc_stubs.HOST_TOOLS)
            work = tmp_path / "work"
            work.mkdir()
            r = checks.run_shell(ROOT, doc, stubs=stubs, env=env, pins=pins, workdir=work)
        return r, doc_stubs.calls(state), state, work, endpoint

    return run


RUN_WITH = {NEBIUS: PUBLISHED, NEBIUS_JOB: PUBLISHED}


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


# ---- the serving guide (an endpoint) -------------------------------------------------------------


def test_nebius_serving_guide_end_to_end(run_doc):
    r, calls, state, _, endpoint = run_doc(NEBIUS, pins=PUBLISHED)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    pins = guide_pins(NEBIUS)
    creates = nebius_calls(calls, "ai", "endpoint", "create")
    assert len(creates) == 2 and creates[0][-1] == "--dry-run" and creates[1][-1] == "--async"
    assert creates[0][:-1] == creates[1][:-1], "the dry run must validate the same request"
    create = creates[1]
    assert flag(create, "--image") == [f"{pins['IMAGE_REPO']}@{pins['IMAGE_DIGEST']}"]
    assert flag(create, "--platform") == [pins["GPU_PLATFORM"]]
    assert flag(create, "--preset") == [pins["GPU_PRESET"]]
    assert flag(create, "--container-port") == ["8000/http"]
    assert flag(create, "--auth") == ["token"] and "--public=false" in create
    assert flag(create, "--env") == ["PLUGIN_API_BACKEND=cuda-sm90", "PLUGIN_API_STRICT=1"]
    (args,) = flag(create, "--args")
    model, revision = pins["MODEL_ID"], pins["MODEL_REVISION"]
    assert args.startswith(f"serve {model} --revision {revision} --tokenizer-revision {revision} ")
    (token,) = flag(create, "--token")
    assert len(token) == 64 and token not in r.stdout + r.stderr, "the token is never shown"

    # The ID is looked up by name after the create, and every later call uses that ID.
    names = [c["argv"] for c in calls if c["tool"] == "nebius"]
    first_lookup = next(i for i, a in enumerate(names) if a[2:3] == ["get-by-name"])
    assert first_lookup > next(i for i, a in enumerate(names) if a[-1:] == ["--async"])
    used = {a[3] for a in names if a[1:2] == ["endpoint"] and a[2] in ("get", "logs", "delete")}
    assert used == {"aiendpoint-e00stub0001"}
    every_get = nebius_calls(calls, "ai", "endpoint", "get")
    assert all("json" in flag(g, "--format") for g in every_get)

    # Readiness was the real tool, and the chat request came only once it had passed; the URL
    # came while the endpoint was STARTING, and RUNNING was never waited for.
    seen = [(q["method"], q["path"], q["status"]) for q in endpoint.requests]
    assert seen[:3] == [("GET", "/health", 404), ("GET", "/health", 503), ("GET", "/health", 200)]
    one_token = next(q for q in endpoint.requests if q["path"] == "/v1/completions")
    assert one_token["body"]["max_tokens"] == 1 and one_token["body"]["model"] == model
    chat = next(i for i, q in enumerate(endpoint.requests) if q["path"] == "/v1/chat/completions")
    assert chat > endpoint.requests.index(one_token) and endpoint.requests[chat]["status"] == 200
    assert f"ready: {model} answers at {endpoint.url}" in r.stdout
    assert "A GPU is a processor" in r.stdout
    unauthorized = [q for q in endpoint.requests if not q["authorized"]]
    assert [(q["path"], q["status"]) for q in unauthorized] == [("/v1/models", 401)]
    assert "plugin-api backend cuda-sm90 (plugin-api-cuda-sm90 0.1.0, validated)" in r.stdout

    # Deleted, and confirmed: a get that says NotFound, then a list without it.
    order = [" ".join(a[1:3]) for a in names]
    deleted = order.index("endpoint delete")
    assert order[deleted + 1 :] == ["endpoint get", "endpoint list"]
    assert json.loads((state / "nebius.json").read_text())["endpoints"] == {}
    assert f"endpoint {names[deleted][3]} is gone" in r.stdout


def test_nebius_serving_guide_refuses_the_placeholder_image(run_doc):
    r, calls, *_ = run_doc(NEBIUS)  # the pins as committed
    assert r.returncode != 0
    assert "IMAGE_DIGEST is the placeholder" in r.stderr
    assert nebius_calls(calls, "ai", "endpoint", "create") == []


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("old-image", "the image carries plugin-api-vllm 0.0.9, the guide pins 0.1.0"),
        ("bad-revision", "the Hub has no Qwen/Qwen3-0.6B at "),
    ],
)
def test_nebius_serving_guide_preflight_stops_before_renting(run_doc, scenario, message):
    r, calls, *_ = run_doc(NEBIUS, scenario, PUBLISHED)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert nebius_calls(calls, "ai", "endpoint", "create") == []


def test_nebius_serving_guide_waits_a_bounded_time_for_the_url(run_doc):
    r, calls, *_ = run_doc(NEBIUS, "no-capacity", PUBLISHED, URL_POLLS="4")
    assert r.returncode != 0
    assert "(PROVISIONING) has no single HTTPS URL after 4 polls" in r.stderr
    assert len(nebius_calls(calls, "ai", "endpoint", "get")) == 4


def test_nebius_serving_guide_never_takes_running_for_ready(run_doc):
    r, calls, _, _, endpoint = run_doc(NEBIUS, "never-loads", {**PUBLISHED, "READY_TIMEOUT": "2"})
    assert r.returncode != 0
    assert "is not ready: /health never answered 200" in r.stderr
    assert "it is RUNNING" in r.stderr, "the endpoint was RUNNING all along"
    assert "not ready: waiting for health: /health answered 503" in r.stderr  # the tool says why
    assert {q["path"] for q in endpoint.requests} == {"/health"}, "no request before readiness"
    assert nebius_calls(calls, "ai", "endpoint", "delete") == [], "left for the logs, billing"
    assert "it bills until deleted" in r.stderr


@pytest.mark.parametrize(
    "scenario, message, last_path",
    [
        ("wrong-model", "does not serve Qwen/Qwen3-0.6B", "/v1/models"),
        ("completion-fails", "a one-token completion failed", "/v1/completions"),
        ("no-plugin", "the log does not show cuda-sm90 0.1.0 serving", "/v1/completions"),
        ("experimental", "the log does not show cuda-sm90 0.1.0 serving", "/v1/completions"),
        ("open", "answered HTTP 200 without the token", "/v1/models"),
    ],
)
def test_nebius_serving_guide_stops_on_a_wrong_answer(run_doc, scenario, message, last_path):
    pins = {**PUBLISHED, "READY_TIMEOUT": "2"}
    r, calls, _, _, endpoint = run_doc(NEBIUS, scenario, pins)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
    assert endpoint.requests[-1]["path"] == last_path
    chats = [q for q in endpoint.requests if q["path"] == "/v1/chat/completions"]
    assert chats == [] or scenario == "open"
    assert nebius_calls(calls, "ai", "endpoint", "delete") == []


def test_nebius_serving_guide_greps_what_the_bridge_logs():
    """The plugin check reads the bridge's own log lines: they must stay what it greps."""
    vllm = ROOT / "integrations" / "vllm" / "plugin_api_vllm"
    assert "plugin-api serves this model" in (vllm / "workers" / "bridge.py").read_text()
    report = (vllm / "report.py").read_text()
    summary = (
        "plugin-api backend {report['backend']} ({report['distribution']}, {report['status']})"
    )
    assert summary in report and '"distribution": f"{sel.distribution} {sel.version}"' in report
    pins = guide_pins(NEBIUS)
    version = pins["PLUGIN_API_CUDA_SM90_VERSION"]
    line = f"plugin-api backend cuda-sm90 (plugin-api-cuda-sm90 {version}, validated)"
    text = NEBIUS.read_text().replace("$PLUGIN_API_CUDA_SM90_VERSION", version)
    assert f'served="{line}"' in text and '"plugin-api serves this model"' in text
    ep = {"spec": {"env": ["PLUGIN_API_BACKEND=cuda-sm90"], "args": "serve m"}}
    assert line in doc_stubs.endpoint_log(ep)


def test_nebius_serving_guide_reads_the_readiness_tools_exit_codes():
    from plugin_api_vllm import ready

    assert (ready.HEALTH, ready.MODEL, ready.COMPLETION) == (3, 4, 5)
    text = NEBIUS.read_text()
    assert 'python3 -m plugin_api_vllm.ready "$ENDPOINT_URL"' in text
    for code in (3, 4, 5):
        assert f"    {code}) why=" in text


def test_the_serving_image_installs_the_guides_pins():
    from plugin_api_vllm.versions import SUPPORTED_VLLM

    from ci.images import dockerfile as dfp
    from ci.images.lint import lint
    from plugin_api_cuda_sm90.versions import VALIDATED

    path = ROOT / "docs" / "deploy" / "serving.Dockerfile"
    pins = guide_pins(NEBIUS)
    df = dfp.parse(path.read_text())
    args = dict(
        w.split("=", 1)
        for ins in df.instructions
        if ins.keyword == "ARG"
        for w in ins.rest.split()
        if "=" in w
    )
    versions = {k: v for k, v in args.items() if k.endswith("_VERSION")}
    assert versions == {k: v for k, v in pins.items() if k.endswith("_VERSION") and k in versions}
    assert set(versions) == {k for k in pins if k.endswith("_VERSION")} - {"NEBIUS_CLI_VERSION"}
    assert doc_stubs.image_labels() == {
        f"org.plugin-api.version.{d}": pins[f"{d.upper().replace('-', '_')}_VERSION"]
        for d in ("vllm", "plugin-api", "plugin-api-cuda-sm90", "plugin-api-vllm")
    } | {"org.plugin-api.version.flashinfer-python": pins["FLASHINFER_VERSION"]}
    (low, high) = SUPPORTED_VLLM
    vllm = tuple(int(x) for x in pins["VLLM_VERSION"].split(".")[:2])
    assert low <= vllm < high, "the bridge does not support the pinned vLLM"
    assert VALIDATED.contains(pins["FLASHINFER_VERSION"]), "cuda-sm90 does not validate it"
    assert lint(path) == []
    for ins in df.instructions:  # the Python the build runs at least compiles
        if ins.keyword == "RUN" and "python -c" in ins.rest:
            for code in re.findall(r'python -c "([^"]+)"', ins.rest):
                compile(code, f"{path.name}:{ins.line}", "exec")


# ---- the validation guide (a job) ----------------------------------------------------------------


def test_nebius_job_guide_end_to_end(run_doc):
    r, calls, state, work, _ = run_doc(NEBIUS_JOB, pins=PUBLISHED)
    assert r.returncode == 0, r.stderr[-2000:]
    pins = guide_pins(NEBIUS_JOB)
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


def test_nebius_job_guide_refuses_the_placeholder_image(run_doc):
    r, calls, *_ = run_doc(NEBIUS_JOB)  # the pins as committed
    assert r.returncode != 0
    assert "IMAGE_DIGEST is the placeholder" in r.stderr
    assert nebius_calls(calls, "ai", "job", "create") == []


def test_nebius_job_guide_waits_a_bounded_time_for_the_report(run_doc):
    r, calls, *_ = run_doc(NEBIUS_JOB, "no-pull", PUBLISHED, READY_POLLS="6")
    assert r.returncode != 0
    assert "(STARTING) did not report ready in 6 polls" in r.stderr
    assert len(nebius_calls(calls, "ai", "job", "logs")) == 6


def test_nebius_job_guide_stops_when_the_backend_is_unavailable(run_doc):
    r, calls, state, *_ = run_doc(NEBIUS_JOB, "unavailable", PUBLISHED)
    assert r.returncode != 0 and "is FAILED and never reported ready" in r.stderr
    assert not any(c["tool"] in ("pytest", "aws") for c in calls), "no kit, nothing collected"
    summary = next((state / "buckets").rglob("summary.json"))
    assert "unavailable here" in json.loads(summary.read_text())["ready"]["problems"][0]


def test_nebius_job_guide_stops_before_the_kit_on_another_image(run_doc):
    r, calls, state, *_ = run_doc(NEBIUS_JOB, "old-image", PUBLISHED)
    assert r.returncode != 0
    assert not any(c["tool"] == "pytest" for c in calls)
    problems = json.loads(next((state / "buckets").rglob("summary.json")).read_text())
    assert "plugin-api 0.0.9 in the image, the guide pins 0.1.0" in problems["ready"]["problems"]


def test_nebius_job_guide_reports_a_failing_kit_and_keeps_the_job(run_doc):
    r, calls, _, work, _ = run_doc(NEBIUS_JOB, "kit-fails", PUBLISHED)
    assert r.returncode != 0
    summary = json.loads(next((work / "plugin-api-results").rglob("summary.json")).read_text())
    assert summary["status"] == "failed" and summary["steps"]["kit"] == 1
    assert nebius_calls(calls, "ai", "job", "delete") == [], "logs are kept for the failure"


@pytest.mark.parametrize("doc", [NEBIUS, NEBIUS_JOB], ids=lambda p: p.name)
def test_nebius_placeholder_digest_is_the_documented_one(doc):
    pins = guide_pins(doc)
    sentence = re.search(r"printf '%s' '([^']+)' \| sha256sum", doc.read_text())
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
