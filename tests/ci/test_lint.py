"""Lint findings, Dockerfile parsing and .dockerignore matching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci.images import dockerfile as dfp
from ci.images import dockerignore
from ci.images.errors import DockerfileError
from ci.images.lint import lint, lint_dockerfile

from .conftest import registry_binary

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "e" * 64
SHA = "0123456789abcdef0123456789abcdef01234567"
UNPINNED = f"""\
# syntax=docker/dockerfile:1
ARG COMMIT={SHA}
FROM ubuntu:24.04 AS base
FROM base
FROM ubuntu@{DIGEST}
RUN apt-get update && apt-get install -y --no-install-recommends curl git=1:2.43.0-1 \\
    && curl -fsSL https://example.org/x.sh | sh
RUN pip install requests "numpy>=1.26" torch==2.4.0 ./local -e plugins/x
RUN python3 -m pip install -r requirements.txt && pip3 install --require-hashes -r locked.txt
RUN pip install git+https://github.com/a/b.git git+https://github.com/a/c.git@{SHA}
RUN git clone https://github.com/a/b.git /b
RUN git clone https://github.com/a/c.git /c && git -C /c checkout ${{COMMIT}}
ADD https://example.org/a.tar.gz /a
ADD --checksum=sha256:{"f" * 64} https://example.org/b.tar.gz /b
COPY --from=busybox:1.36 /bin/sh /sh
COPY --from=base /etc/os-release /os-release
"""


def test_lint_findings() -> None:
    found = {(f.line, f.rule, f.severity, f.message) for f in lint_dockerfile(dfp.parse(UNPINNED))}
    assert found == {
        (
            1,
            "syntax-unpinned",
            "error",
            "# syntax=docker/dockerfile:1: frontend image without digest",
        ),
        (3, "from-unpinned", "error", "FROM ubuntu:24.04: no @sha256 digest; a tag can move"),
        (6, "apt-unpinned", "warning", "apt-get install curl: no =version"),
        (6, "download-unchecked", "warning", "curl/wget without a sha256sum check"),
        (8, "pip-unpinned", "error", "pip install requests: not pinned with =="),
        (8, "pip-unpinned", "error", "pip install numpy>=1.26: not pinned with =="),
        (
            9,
            "pip-unpinned",
            "error",
            "pip install -r requirements.txt: the lint does not read it; use --require-hashes",
        ),
        (
            10,
            "pip-unpinned",
            "error",
            "pip install git+https://github.com/a/b.git: URL without a commit or #sha256= hash",
        ),
        (
            11,
            "git-unpinned",
            "error",
            "git clone https://github.com/a/b.git: "
            "no `git checkout <commit>` (40 hex) in the same RUN",
        ),
        (13, "add-unpinned", "error", "ADD https://example.org/a.tar.gz: no --checksum=sha256:"),
        (15, "from-unpinned", "error", "--from=busybox:1.36: image without digest"),
    }


def test_repo_dockerfiles_pass_the_lint() -> None:
    for plugin in ("rocm", "cuda-sm90"):
        assert lint(REPO / "plugins" / plugin / "docker" / "Dockerfile") == []
    assert lint(REPO / "docs" / "deploy" / "serving.Dockerfile") == []


def test_lint_cli_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:24.04\nRUN apt-get install -y curl\n")
    cmd = [sys.executable, "-m", "ci.images", "lint", "--json", str(bad)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 1
    assert json.loads(out.stdout)["errors"] == 1
    bad.write_text(f"FROM ubuntu@{DIGEST}\nRUN apt-get install -y curl\n")  # warnings only
    assert subprocess.run(cmd, cwd=REPO, capture_output=True).returncode == 0


def test_parse_continuations_comments_and_directives() -> None:
    df = dfp.parse(
        "# escape=`\nFROM a@" + DIGEST + "\nRUN echo one `\n# a comment inside\n\n    two\n"
        'COPY --chown=1:1 --link ["a b", "/c"]\n'
    )
    assert df.escape == "`"
    run, copy = df.instructions[1], df.instructions[2]
    assert (run.line, run.rest) == (3, "echo one     two")
    assert copy.flags == (("chown", "1:1"), ("link", None))
    assert copy.exec_form == ("a b", "/c")


def test_words_quotes_and_variables() -> None:
    env = {"A": "x", "EMPTY": "", "UNSET": None}
    assert dfp.words("'$A b' \"$A b\" ${A}c \\$A", env) == ["$A b", "x b", "xc", "$A"]
    assert dfp.words("${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${A:+y} ${NONE:-z}", env) == [
        "d",
        "",
        "d",
        "y",
        "z",
    ]
    with pytest.raises(DockerfileError, match=r"\$NONE is not defined"):
        dfp.words("$NONE", env, strict=True)
    with pytest.raises(DockerfileError, match="unsupported variable operator"):
        dfp.words("${A#x}", env)


@pytest.mark.parametrize(
    ("patterns", "path", "excluded"),
    [
        ("**/__pycache__", "a/b/__pycache__/x.pyc", True),
        ("**/__pycache__", "__pycache__", True),
        ("*.md\n!README.md", "README.md", False),
        ("*.md\n!README.md", "NOTES.md", True),
        ("*.md", "docs/a.md", False),  # * stays within one path element
        ("docs", "docs/deep/a.md", True),  # a matched directory excludes what is below
        ("/build", "build/x", True),
        ("a?c", "abc", True),
        ("[ab]x", "cx", False),
    ],
)
def test_dockerignore(patterns: str, path: str, excluded: bool) -> None:
    assert dockerignore.parse(patterns).excluded(path) is excluded


def test_missing_registry_binary_fails_instead_of_skipping(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI_IMAGES_REGISTRY_BIN", str(tmp_path / "no-such-registry"))
    with pytest.raises(pytest.fail.Exception, match="install the Debian package docker-registry"):
        registry_binary()
