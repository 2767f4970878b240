"""The OCI client against a real registry (and a misbehaving proxy in front of it)."""

from __future__ import annotations

import hashlib
import time

import pytest

from ci.images.errors import RegistryError
from ci.images.registry import Registry, State

from .faulty import FaultyProxy, Rule
from .oci import push_image, push_index


def test_resolve_found_missing_and_unknown_repository(client: Registry, repo: str) -> None:
    digest = push_image(client, repo, "v1", {"a": "1"})
    found = client.lookup_tag(repo, "v1")
    assert found.state is State.FOUND
    assert found.digest == digest
    assert digest == "sha256:" + hashlib.sha256(client.manifest(repo, "v1").raw).hexdigest()
    assert client.lookup_tag(repo, "nope").state is State.MISSING
    assert client.lookup_tag(repo + "-never-pushed", "v1").state is State.MISSING


def test_labels_and_annotations_are_read_by_digest(client: Registry, repo: str) -> None:
    digest = push_image(client, repo, "v1", {"x.y": "z"}, annotations={"note": "n"})
    facts = client.image_facts(repo, digest)
    assert facts.labels == {"x.y": "z"}
    assert facts.annotations == {"note": "n"}
    assert facts.digest == digest


def test_add_tag_reputs_identical_bytes(client: Registry, repo: str) -> None:
    digest = push_image(client, repo, "first", {"a": "1"})
    assert client.add_tag(repo, digest, "second") == digest
    assert client.manifest(repo, "second").raw == client.manifest(repo, "first").raw
    assert client.lookup_tag(repo, "second").digest == digest
    assert client.list_tags(repo) == ["first", "second"]
    assert client.list_tags(repo + "-never-pushed") == []


def test_index_picks_the_platform_manifest(client: Registry, repo: str) -> None:
    amd = push_image(client, repo, "amd", {"arch": "amd64"}, content=b"amd")
    arm = push_image(client, repo, "arm", {"arch": "arm64"}, content=b"arm")
    index = push_index(client, repo, "multi", {"linux/amd64": amd, "linux/arm64": arm})
    assert client.image_facts(repo, index, platform="linux/arm64").labels == {"arch": "arm64"}
    assert client.image_facts(repo, index).labels == {"arch": "amd64"}
    with pytest.raises(RegistryError, match="no manifest for platform linux/s390x"):
        client.image_facts(repo, index, platform="linux/s390x")


def test_http_500_is_an_error_after_retries(
    proxy: FaultyProxy, client: Registry, repo: str
) -> None:
    push_image(client, repo, "v1", {"a": "1"})
    proxy.rules.append(Rule("fail", path="/manifests/"))
    via = Registry(proxy.url, timeout=2, retries=2, backoff=0.01)
    res = via.lookup_tag(repo, "v1")
    assert res.state is State.ERROR
    assert "HTTP 500" in res.detail and "3 attempt(s)" in res.detail
    assert proxy.count("HEAD", "/manifests/v1") == 3
    with pytest.raises(RegistryError, match="HTTP 500"):
        via.add_tag(repo, client.lookup_tag(repo, "v1").digest or "", "v2")
    assert client.list_tags(repo) == ["v1"]


def test_timeout_is_an_error_not_a_miss(proxy: FaultyProxy, repo: str) -> None:
    proxy.rules.append(Rule("hang", path="/manifests/", seconds=30))
    via = Registry(proxy.url, timeout=0.3, retries=1, backoff=0.01)
    start = time.monotonic()
    res = via.lookup_tag(repo, "v1")
    assert res.state is State.ERROR
    assert "timed out" in res.detail or "Timeout" in res.detail, res.detail
    assert time.monotonic() - start < 5


def test_refused_connection_is_an_error() -> None:
    from .conftest import free_port

    res = Registry(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0).lookup_tag("a/b", "t")
    assert res.state is State.ERROR
    assert "refused" in res.detail.lower()


def test_bearer_token_flow(proxy: FaultyProxy, client: Registry, repo: str) -> None:
    digest = push_image(client, repo, "v1", {"a": "1"})
    proxy.token = "tok-123"
    with_creds = Registry(proxy.url, timeout=2, retries=0, credentials=proxy.credentials)
    assert with_creds.lookup_tag(repo, "v1").digest == digest
    anonymous = Registry(proxy.url, timeout=2, retries=0)
    res = anonymous.lookup_tag(repo, "v1")
    assert res.state is State.ERROR  # an auth failure is never read as "missing"
    assert "token request" in res.detail
