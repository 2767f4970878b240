"""``python -m ci.pins check`` against the real registry: current, stale, missing, registry
error, placeholders, invalid pins, and the exit code of each."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ci.docblocks import blocks, parse_pins, pins_blocks
from ci.images.names import STABLE_TAG
from ci.images.registry import Registry
from ci.pins.cli import exit_code, main
from ci.pins.freshness import Result, Status
from ci.pins.pinned import locate

from .faulty import FaultyProxy, Rule
from .oci import delete_manifest, push_image

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDES = ("nebius-serverless.md", "nebius-validate-job.md")  # serving (endpoint), validation (job)
PLACEHOLDER = "sha256:" + "0" * 64


def guide(path: Path, *images: tuple[str, str, str, str, str]) -> dict[str, int]:
    """Write a guide whose pins block pins ``images`` (name, repo, tag, digest, placeholder);
    returns the line of each ``<name>_DIGEST``."""
    pins = []
    for name, repo, tag, digest, placeholder in images:
        pins += [
            f'{name}_REPO="{repo}"',
            f'{name}_TAG="{tag}"  # followed by {name}_DIGEST',
            f'{name}_DIGEST="{digest}"',
            f'{name}_DIGEST_IS_PLACEHOLDER="{placeholder}"',
        ]
    uses = [f'docker pull "${n}_REPO@${n}_DIGEST"' for n, *_ in images]
    text = "# Guide\n\n```bash pins\n" + "\n".join(pins) + "\n```\n\n```bash\n"
    text += "\n".join(uses) + "\n```\n"
    path.write_text(text, encoding="utf-8")
    lines = text.splitlines()
    return {n: lines.index(f'{n}_DIGEST="{d}"') + 1 for n, _, _, d, _ in images}


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc = main(["check", "--json", "--retries", "1", "--timeout", "5", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_current_then_stale_then_missing(
    tmp_path: Path, client: Registry, repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old = push_image(client, repo, "stable", {"v": "1"}, content=b"one")
    doc = tmp_path / "guide.md"
    line = guide(doc, ("IMAGE", f"{client.host}/{repo}", "stable", old, "0"))["IMAGE"]
    registry = ["--registry", client.url, str(doc)]

    rc, data = check(capsys, *registry)
    assert rc == 0 and data["counts"] == {"current": 1}
    (r,) = data["results"]
    assert (r["status"], r["pinned"], r["tag_digest"], r["line"]) == ("current", old, old, line)
    assert r["doc"] == doc.resolve().as_posix() and r["registry"] == client.url

    new = push_image(client, repo, "stable", {"v": "2"}, content=b"two")  # the tag moves
    rc, data = check(capsys, *registry)
    assert rc == 10
    (r,) = data["results"]
    assert (r["status"], r["pinned"], r["tag_digest"]) == ("stale", old, new)
    assert f"update IMAGE_DIGEST at {doc.resolve().as_posix()}:{line} to {new}" in r["detail"]
    rc = main(["check", "--registry", client.url, str(doc)])
    shown = capsys.readouterr().out
    assert rc == 10 and f"guide.md:{line} IMAGE" in shown and old in shown and new in shown

    delete_manifest(client, repo, new)  # the tag goes with it
    rc, data = check(capsys, *registry)
    assert rc == 11 and data["results"][0]["status"] == "missing"
    assert "tag stable is gone" in data["results"][0]["detail"]


def test_an_unknown_tag_is_missing(
    tmp_path: Path, client: Registry, repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = push_image(client, repo, "v1", {"v": "1"})
    guide(tmp_path / "g.md", ("IMAGE", f"{client.host}/{repo}", "never-pushed", digest, "0"))
    rc, data = check(capsys, "--registry", client.url, str(tmp_path))
    assert rc == 11 and data["counts"] == {"missing": 1}


def test_a_registry_error_is_never_current(
    tmp_path: Path,
    client: Registry,
    proxy: FaultyProxy,
    repo: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    digest = push_image(client, repo, "stable", {"v": "1"})
    guide(tmp_path / "g.md", ("IMAGE", f"{client.host}/{repo}", "stable", digest, "0"))
    proxy.rules.append(Rule("fail", path="/manifests/"))
    rc, data = check(capsys, "--registry", proxy.url, str(tmp_path))
    assert rc == 3
    (r,) = data["results"]
    assert r["status"] == "registry-error" and r["tag_digest"] is None
    assert "HTTP 500" in r["detail"] and "2 attempt(s)" in r["detail"]
    assert proxy.count("HEAD", "/manifests/stable") == 2  # retried, then given up
    rc, _ = check(capsys, "--registry", client.url, str(tmp_path))
    assert rc == 0, "the same pin, asked directly, is current"


def test_a_registry_that_does_not_answer_is_an_error(
    tmp_path: Path, proxy: FaultyProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    guide(tmp_path / "g.md", ("IMAGE", "h.io/test/x", "stable", PLACEHOLDER, "0"))
    proxy.rules.append(Rule("hang", path="/manifests/", seconds=30))
    rc = main(
        [
            "check",
            "--json",
            "--timeout",
            "0.3",
            "--retries",
            "0",
            "--registry",
            proxy.url,
            str(tmp_path),
        ]
    )
    (r,) = json.loads(capsys.readouterr().out)["results"]
    assert rc == 3 and r["status"] == "registry-error"
    assert "timed out" in r["detail"] or "Timeout" in r["detail"], r["detail"]


def test_placeholders_are_not_looked_up_unless_strict(
    tmp_path: Path, proxy: FaultyProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    guide(tmp_path / "g.md", ("IMAGE", "127.0.0.1/test/x", "stable", PLACEHOLDER, "1"))
    proxy.rules.append(Rule("fail"))
    rc, data = check(capsys, "--registry", proxy.url, str(tmp_path))
    assert rc == 0 and data["counts"] == {"placeholder": 1}
    rc, data = check(capsys, "--strict", "--registry", proxy.url, str(tmp_path))
    assert rc == 12 and data["strict"] is True
    assert proxy.seen == []


def test_the_most_urgent_outcome_decides_the_exit_code(
    tmp_path: Path, client: Registry, repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one = push_image(client, repo, "one", {"v": "1"}, content=b"1")
    two = push_image(client, repo, "two", {"v": "2"}, content=b"2")
    ref = f"{client.host}/{repo}"
    guide(
        tmp_path / "a.md",
        ("CURRENT", ref, "one", one, "0"),
        ("MOVED", ref, "two", one, "0"),
        ("DRAFT", ref, "one", PLACEHOLDER, "1"),
    )
    rc, data = check(capsys, "--registry", client.url, str(tmp_path))
    assert rc == 10
    assert data["counts"] == {"current": 1, "placeholder": 1, "stale": 1}
    assert [r["name"] for r in data["results"]] == ["CURRENT", "DRAFT", "MOVED"]
    assert data["results"][2]["tag_digest"] == two
    guide(tmp_path / "b.md", ("GONE", ref, "three", one, "0"))
    assert check(capsys, "--registry", client.url, str(tmp_path))[0] == 11


def result(status: Status) -> Result:
    return Result(status, "d.md", 1, "IMAGE", "r:t", None, None, None, "")


@pytest.mark.parametrize(
    "statuses, strict, code",
    [
        ([Status.CURRENT, Status.PLACEHOLDER], False, 0),
        ([Status.CURRENT, Status.PLACEHOLDER], True, 12),
        ([Status.PLACEHOLDER, Status.STALE], True, 10),
        ([Status.STALE, Status.MISSING], False, 11),
        ([Status.MISSING, Status.ERROR, Status.STALE], False, 3),
        ([Status.ERROR, Status.INVALID], False, 1),
    ],
)
def test_exit_code_precedence(statuses: list[Status], strict: bool, code: int) -> None:
    assert exit_code([result(s) for s in statuses], strict=strict) == code


@pytest.mark.parametrize(
    "pins, message",
    [
        ('IMAGE_REPO="h.io/x"\nIMAGE_DIGEST="{d}"', "has no IMAGE_TAG"),
        ('IMAGE_TAG="v1"\nIMAGE_DIGEST="{d}"', "has no IMAGE_REPO"),
        ('IMAGE_REPO="h.io/x"\nIMAGE_TAG="v1"\nIMAGE_DIGEST="sha256:abc"', "not sha256:"),
        (
            'IMAGE_REPO="h.io/x"\nIMAGE_TAG="v1"\nIMAGE_DIGEST="{d}"\n'
            'IMAGE_DIGEST_IS_PLACEHOLDER="yes"',
            "expected 0 or 1",
        ),
        ('IMAGE_REPO="h.io/x"\nIMAGE_TAG="bad tag!"\nIMAGE_DIGEST="{d}"', "not a valid OCI tag"),
        ('IMAGE_REPO="x"\nIMAGE_TAG="v1"\nIMAGE_DIGEST="{d}"', "names no registry host"),
        ("echo not a pin", "not a NAME=value pin"),
        ('VLLM_VERSION="latest"', "is not a version such as 1.2.3"),
        ('MODEL_REVISION="main"', "is not a 40-hex-digit commit"),
    ],
)
def test_pins_that_cannot_be_checked_are_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pins: str, message: str
) -> None:
    doc = tmp_path / "g.md"
    doc.write_text(f"# G\n\n```bash pins\n{pins.format(d=PLACEHOLDER)}\n```\n")
    rc, data = check(capsys, str(doc))  # no --registry: nothing is looked up
    assert rc == 1, data
    (r,) = data["results"]
    assert r["status"] == "invalid" and message in r["detail"], r["detail"]


def test_nothing_to_check_is_not_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.md").write_text("# No pins\n\n```bash\necho hi\n```\n")
    rc, data = check(capsys, str(tmp_path))
    assert rc == 1 and data["results"][0]["detail"] == "no pinned image"
    with pytest.raises(SystemExit) as e:
        main(["check", str(tmp_path / "nowhere.md")])
    assert e.value.code == 2


@pytest.mark.parametrize(
    "repo, registry, where",
    [
        ("cr.eu-north1.nebius.cloud/a/b", None, ("https://cr.eu-north1.nebius.cloud", "a/b")),
        ("localhost:5000/a", None, ("https://localhost:5000", "a")),
        ("h.io/a/b", "http://127.0.0.1:5000", ("http://127.0.0.1:5000", "a/b")),
        ("team/image", "http://127.0.0.1:5000", ("http://127.0.0.1:5000", "team/image")),
    ],
)
def test_locate(repo: str, registry: str | None, where: tuple[str, str]) -> None:
    assert locate(repo, registry) == where


# ---- the repository's docs -----------------------------------------------------------------------


def test_the_repository_pins_are_checked_and_the_placeholder_is_reported() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ci.pins", "check", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == [f"placeholder    docs/deploy/{g}" for g in GUIDES]
    assert run("--strict").returncode == 12


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_follow_the_stable_alias(guide: str) -> None:
    block = pins_blocks(blocks(REPO_ROOT / "docs" / "deploy" / guide))[0]
    pins, bad = parse_pins(guide, block)
    assert bad == [] and pins["IMAGE_TAG"][1] == STABLE_TAG


def test_every_other_pin_of_a_guide_is_checked_for_its_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Versions and revisions are not looked up, but one that is not of its kind is invalid."""
    doc = tmp_path / "g.md"
    guide(doc, ("IMAGE", "h.io/x", "stable", PLACEHOLDER, "1"))
    text = doc.read_text()
    pins = 'VLLM_VERSION="0.32.0"\nMODEL_REVISION="' + "c" * 40 + '"\n'
    doc.write_text(text.replace("```bash pins\n", "```bash pins\n" + pins, 1))
    rc, data = check(capsys, str(doc))
    assert rc == 0 and data["counts"] == {"placeholder": 1}
    doc.write_text(text.replace("```bash pins\n", '```bash pins\nVLLM_VERSION="v0.32"\n', 1))
    rc, data = check(capsys, str(doc))
    assert rc == 1 and data["counts"] == {"invalid": 1, "placeholder": 1}
    (bad,) = [r for r in data["results"] if r["status"] == "invalid"]
    assert bad["line"] == 4 and "VLLM_VERSION='v0.32' is not a version" in bad["detail"]


def test_the_documented_job_reads_fields_the_check_writes(
    tmp_path: Path, client: Registry, repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The jq filter of the scheduled job in docs/ci-images.md, run on a real stale report."""
    text = (REPO_ROOT / "docs" / "ci-images.md").read_text(encoding="utf-8")
    job = next(b.text for b in blocks(REPO_ROOT / "docs/ci-images.md") if "pins.json" in b.text)
    assert "python -m ci.pins check --json --registry" in job
    jq = re.search(r"jq -r '([^']+)' pins\.json", job)
    assert jq is not None and text.count(jq[1]) == 1
    old = push_image(client, repo, "stable", {"v": "1"}, content=b"one")
    line = guide(tmp_path / "g.md", ("IMAGE", f"{client.host}/{repo}", "stable", old, "0"))
    new = push_image(client, repo, "stable", {"v": "2"}, content=b"two")
    rc, data = check(capsys, "--registry", client.url, str(tmp_path))
    assert rc == 10
    out = subprocess.run(
        ["jq", "-r", jq[1]], input=json.dumps(data), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"- `{(tmp_path / 'g.md').resolve().as_posix()}:{line['IMAGE']}`")
    assert "stale" in out.stdout and new in out.stdout
