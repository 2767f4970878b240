"""The image key: what changes it, what does not, and what it refuses to hash."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci.images.errors import DockerfileError, InputError
from ci.images.key import compute

REPO = Path(__file__).resolve().parents[2]
PARENT = "example.org/base@sha256:" + "a" * 64
DOCKERFILE = f"""\
ARG BASE={PARENT}
FROM ${{BASE}}
ARG FLAVOUR=plain
COPY app.py setup.cfg /src/
COPY pkg /src/pkg
RUN python -m pip install pytest==9.2.0
"""
FILES = {"app.py": "print(1)\n", "setup.cfg": "[x]\n", "pkg/a.py": "A = 1\n", "pkg/sub/b.py": "B\n"}


def make(root: Path, dockerfile: str = DOCKERFILE, files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in (FILES if files is None else files).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        (root / rel).chmod(0o644)  # independent of the umask
    (root / "Dockerfile").write_text(dockerfile)
    return root


def key_of(root: Path, **kwargs: object) -> str:
    return compute(root / "Dockerfile", root, **kwargs).key  # type: ignore[arg-type]


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    return make(tmp_path / "ctx")


def test_record_lists_every_input(ctx: Path) -> None:
    k = compute(ctx / "Dockerfile", ctx)
    paths = [i["path"] for i in k.record["inputs"]]
    assert paths == ["Dockerfile", "app.py", "pkg/a.py", "pkg/sub", "pkg/sub/b.py", "setup.cfg"]
    app = next(i for i in k.record["inputs"] if i["path"] == "app.py")
    assert app == {
        "path": "app.py",
        "type": "file",
        "mode": "0644",
        "sha256": hashlib.sha256(b"print(1)\n").hexdigest(),
    }
    assert k.record["parents"] == [PARENT]
    assert k.record["schema"] == 2
    assert {(a["name"], a["value"]) for a in k.record["args"]} == {
        ("BASE", PARENT),
        ("FLAVOUR", "plain"),
    }


@pytest.mark.parametrize("rel", ["app.py", "pkg/sub/b.py", "Dockerfile"])
def test_each_input_file_changes_the_key(ctx: Path, rel: str) -> None:
    before = key_of(ctx)
    with (ctx / rel).open("a") as f:
        f.write("# changed\n")
    assert key_of(ctx) != before


def test_a_new_file_in_a_copied_directory_changes_the_key(ctx: Path) -> None:
    before = key_of(ctx)
    (ctx / "pkg" / "new.py").write_text("")
    assert key_of(ctx) != before


def test_a_mode_bit_changes_the_key(ctx: Path) -> None:
    before = key_of(ctx)
    (ctx / "app.py").chmod(0o755)
    assert key_of(ctx) != before
    (ctx / "app.py").chmod(0o644)
    assert key_of(ctx) == before


def test_build_args_change_the_key_only_when_the_effective_value_changes(ctx: Path) -> None:
    before = key_of(ctx)
    assert key_of(ctx, build_args={"FLAVOUR": "plain"}) == before  # same as the default
    assert key_of(ctx, build_args={"FLAVOUR": "fancy"}) != before
    assert key_of(ctx, build_args={"HTTP_PROXY": "http://proxy:3128"}) == before  # transport


def test_parent_digest_changes_the_key(ctx: Path) -> None:
    other = "example.org/base@sha256:" + "b" * 64
    assert key_of(ctx, build_args={"BASE": other}) != key_of(ctx)


def test_platform_changes_the_key(ctx: Path) -> None:
    assert key_of(ctx, platform="linux/arm64") != key_of(ctx)


def test_file_order_does_not_matter(tmp_path: Path) -> None:
    forward = make(tmp_path / "a", files=FILES)
    backward = make(tmp_path / "b", files=dict(reversed(list(FILES.items()))))
    (backward / "pkg" / "sub" / "b.py").touch()  # a different mtime is not an input
    assert (
        compute(forward / "Dockerfile", forward).record
        == compute(backward / "Dockerfile", backward).record
    )
    assert key_of(forward) == key_of(backward)


def test_listing_a_file_twice_counts_it_once(tmp_path: Path) -> None:
    twice = DOCKERFILE.replace("COPY pkg /src/pkg", "COPY pkg /src/pkg\nCOPY pkg/a.py /x/")
    ctx = make(tmp_path, twice)
    paths = [i["path"] for i in compute(ctx / "Dockerfile", ctx).record["inputs"]]
    assert paths.count("pkg/a.py") == 1


def test_unlisted_copy_source_fails(ctx: Path) -> None:
    (ctx / "app.py").unlink()
    with pytest.raises(InputError, match=r"'app\.py' does not exist in the context"):
        compute(ctx / "Dockerfile", ctx)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("COPY ../outside /x", "outside the build context"),
        ("COPY *.nothing /x/", "matches no file"),
        ("COPY $HOME/x /x", r"\$HOME is not defined"),
        ("ADD https://example.org/a.tar.gz /x", "no --checksum"),
        ("ADD https://github.com/a/b.git /x", "pin it as <url>#<40-hex commit>"),
        ("COPY --from=busybox:1.36 /bin/sh /x", "is not pinned"),
        ("RUN --mount=type=bind,source=missing,target=/m true", "does not exist"),
        ("RUN cat <<EOF > /x", "heredoc"),
        ("FROB x", "unknown instruction"),
    ],
)
def test_inputs_the_key_cannot_cover_are_errors(tmp_path: Path, line: str, message: str) -> None:
    ctx = make(tmp_path, DOCKERFILE + line + "\n")
    with pytest.raises((InputError, DockerfileError), match=message):
        compute(ctx / "Dockerfile", ctx)


def test_tag_only_parent_is_an_error(tmp_path: Path) -> None:
    ctx = make(tmp_path, "FROM ubuntu:24.04\n", files={})
    with pytest.raises(InputError, match=r"'ubuntu:24\.04' is not pinned"):
        compute(ctx / "Dockerfile", ctx)
    ctx = make(tmp_path, DOCKERFILE)
    with pytest.raises(InputError, match="is not pinned"):
        compute(ctx / "Dockerfile", ctx, {"BASE": "example.org/base:latest"})


def test_undeclared_build_arg_is_an_error(ctx: Path) -> None:
    with pytest.raises(InputError, match=r"\['NOPE'\] are not declared"):
        compute(ctx / "Dockerfile", ctx, {"NOPE": "1"})


def test_dockerignore_excluded_files_are_not_inputs(ctx: Path) -> None:
    (ctx / "Dockerfile.dockerignore").write_text("**/__pycache__\n*.cfg\n!setup.cfg\n")
    before = key_of(ctx)
    (ctx / "pkg" / "__pycache__").mkdir()
    (ctx / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert key_of(ctx) == before
    (ctx / "Dockerfile").write_text(DOCKERFILE + "COPY pkg/__pycache__ /x\n")
    with pytest.raises(InputError, match=r"excluded by Dockerfile\.dockerignore"):
        compute(ctx / "Dockerfile", ctx)


def test_stages_remote_checksums_mounts_and_symlinks(tmp_path: Path) -> None:
    image = "example.org/tools@sha256:" + "c" * 64
    text = f"""\
FROM {PARENT} AS build
COPY app.py /app.py
FROM build
COPY --from=build /app.py /b.py
COPY --from={image} /bin/tool /bin/tool
ADD --checksum=sha256:{"d" * 64} https://example.org/a.tar.gz /a.tar.gz
RUN --mount=type=bind,source=pkg,target=/pkg --mount=type=cache,target=/root/.cache true
COPY link /link
"""
    ctx = make(tmp_path, text)
    (ctx / "link").symlink_to("app.py")
    (ctx / "pkg" / "sub" / "rel").symlink_to("b.py")
    record = compute(ctx / "Dockerfile", ctx).record
    assert record["parents"] == [PARENT, "stage:build"]
    assert record["images"] == [image]
    assert record["remote"] == [
        {"url": "https://example.org/a.tar.gz", "checksum": "sha256:" + "d" * 64}
    ]
    by_path = {i["path"]: i for i in record["inputs"]}
    assert "pkg/a.py" in by_path  # from the bind mount
    assert by_path["pkg/sub/rel"] == {"path": "pkg/sub/rel", "type": "symlink", "target": "b.py"}
    assert by_path["app.py"]["type"] == "file"  # a top-level symlink source is followed


SERVING = "docs/deploy/serving.Dockerfile"  # the Nebius serving guide's image


def test_repo_dockerfiles_key_and_cli_json() -> None:
    images = [(f"plugins/{p}/docker/Dockerfile", p) for p in ("rocm", "cuda-sm90")]
    for dockerfile, plugin in [*images, (SERVING, "cuda-sm90")]:
        out = subprocess.run(
            [sys.executable, "-m", "ci.images", "key", "--json", dockerfile],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        data = json.loads(out.stdout)
        record = data["record"]
        assert len(data["key"]) == 64 and data["tags"]["trusted"] == f"base-v2-{data['key']}"
        paths = {i["path"]: i for i in record["inputs"]}
        assert (
            paths[dockerfile]["sha256"]
            == hashlib.sha256((REPO / dockerfile).read_bytes()).hexdigest()
        )
        assert "pyproject.toml" in paths and "plugin_api/ops/attention.py" in paths
        assert any(p.startswith(f"plugins/{plugin}/plugin_api_") for p in paths)
        assert not any("__pycache__" in p or ".egg-info" in p for p in paths)
        assert all(p.split("@")[1].startswith("sha256:") for p in record["parents"])
        if dockerfile == SERVING:  # the bridge goes in too, from the checkout
            assert "integrations/vllm/plugin_api_vllm/ready.py" in paths


def test_automatic_platform_args(tmp_path: Path) -> None:
    text = f"FROM {PARENT}\nARG TARGETARCH\nCOPY app.py /${{TARGETARCH}}.py\n"
    ctx = make(tmp_path, text)
    assert compute(ctx / "Dockerfile", ctx).record["args"] == []  # recorded as the platform
    given = compute(ctx / "Dockerfile", ctx, {"TARGETARCH": "riscv64"}).record["args"]
    assert given == [{"scope": "stage 0", "name": "TARGETARCH", "value": "riscv64"}]
    builder_arg = make(tmp_path / "b", f"FROM {PARENT}\nARG BUILDARCH\n")
    with pytest.raises(InputError, match="depends on the machine that builds"):
        compute(builder_arg / "Dockerfile", builder_arg)
