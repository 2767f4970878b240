"""``python -m ci.images`` end to end against the real registry: JSON output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ci.images.names import LABEL_HASH, LABEL_SCHEMA
from ci.images.registry import Registry

from .faulty import FaultyProxy, Rule
from .oci import push_image

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDER = "ci/trusted-pr-builder"
KEYS = f"{BUILDER}={'5a' * 32}"


def cli(*args: str, keys: str = KEYS) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, CI_IMAGES_ATTESTATION_KEYS=keys)
    out = subprocess.run(
        [sys.executable, "-m", "ci.images", *args, "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}


def test_pr_then_main_then_stable(tmp_path: Path, client: Registry, repo: str) -> None:
    (tmp_path / "tool.py").write_text("print('hi')\n")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM example.org/base@sha256:{'1' * 64}\nCOPY tool.py /tool.py\n")
    common = [str(dockerfile), "--context", str(tmp_path), "--registry", client.url, "--repo", repo]

    rc, data = cli("lookup", "--kind", "pr", *common)
    assert rc == 10 and data["outcome"] == "miss"
    key = data["key"]
    assert data["push_tag"] == f"base-v2-preview-{key}"
    assert data["labels"] == {LABEL_HASH: key, LABEL_SCHEMA: "2"}

    digest = push_image(client, repo, data["push_tag"], data["labels"])  # "the PR build"
    rc, data = cli("lookup", "--kind", "pr", *common)
    assert rc == 0 and data["ref"] == f"{client.host}/{repo}@{digest}"

    rc, data = cli("promote", "trusted", *common)  # default policy: never
    assert rc == 5 and data["error"]["type"] == "PromotionRefused"
    assert data["error"]["message"].endswith("preview images are not promoted")

    rc, data = cli("attest", *common, "--builder", BUILDER)
    assert rc == 0 and data["write"]["source"] == "attest"
    attested = data["write"]["digest"]

    policy = ["--policy", "attested", "--allow-builder", BUILDER]
    rc, data = cli("lookup", "--kind", "main", *common, *policy, keys="")
    assert rc == 10 and "no key for builder" in data["trace"][1]["reason"]
    rc, data = cli("lookup", "--kind", "main", *common, *policy)
    assert rc == 0 and data["source"] == "preview" and data["stable"] is None
    assert data["writes"] == [
        {"tag": f"base-v2-{key}", "digest": attested, "previous": None, "source": "preview"}
    ]

    stable = ["promote", "stable", *common, "--window", "0.2"]
    rc, data = cli(*stable, "--expect", "none")
    assert rc == 0 and data["write"]["digest"] == attested
    rc, data = cli(*stable, "--expect", "none")
    assert rc == 6 and data["error"]["type"] == "StableConflict"
    rc, _ = cli(*stable[:-2])  # --expect is required
    assert rc == 2


def test_registry_error_and_mislabeled_exit_codes(
    tmp_path: Path, proxy: FaultyProxy, client: Registry, repo: str
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM example.org/base@sha256:{'2' * 64}\n")
    args = [str(dockerfile), "--context", str(tmp_path), "--repo", repo, "--retries", "0"]

    proxy.rules.append(Rule("fail", path="/manifests/"))
    rc, data = cli("lookup", "--kind", "main", *args, "--registry", proxy.url)
    assert rc == 3 and data["error"]["type"] == "RegistryError"
    assert "a registry error is not a miss" in data["error"]["message"]
    assert client.list_tags(repo) == []

    rc, data = cli("key", str(dockerfile), "--context", str(tmp_path))
    push_image(client, repo, data["tags"]["trusted"], {LABEL_HASH: "0" * 64, LABEL_SCHEMA: "2"})
    rc, data = cli("lookup", "--kind", "pr", *args, "--registry", client.url)
    assert rc == 4 and data["error"]["type"] == "IdentityMismatch"


def test_key_errors_exit_1(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM ubuntu:24.04\n")
    rc, data = cli("key", str(dockerfile), "--context", str(tmp_path))
    assert rc == 1 and data["error"]["type"] == "InputError"
    assert "repo@sha256:<digest>" in data["error"]["message"]
