"""Lookup and promotion on the lookup path, against a real registry."""

from __future__ import annotations

import json

import pytest

from ci.images import attest
from ci.images.errors import IdentityMismatch, RegistryError
from ci.images.lookup import Kind, find_image
from ci.images.names import LABEL_HASH, LABEL_SCHEMA, STABLE_TAG, Namespace, tag_for
from ci.images.promote import Mode, Policy, attest_preview
from ci.images.registry import Registry

from .faulty import FaultyProxy, Rule
from .oci import key_of, push_for_key, push_image

KEY = key_of("lookup")
OTHER = key_of("other content")
TRUSTED, PREVIEW = tag_for(Namespace.TRUSTED, KEY), tag_for(Namespace.PREVIEW, KEY)
GOOD = "ci/trusted-pr-builder"
KEYRING = attest.Keyring({GOOD: b"k" * 32, "fork/pr-42": b"f" * 32})
ATTESTED = Policy(Mode.ATTESTED, frozenset({GOOD}), KEYRING)


def ref(client: Registry, repo: str, digest: str) -> str:
    return f"{client.host}/{repo}@{digest}"


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("namespace", list(Namespace))
def test_hit_in_each_namespace(
    client: Registry, repo: str, kind: Kind, namespace: Namespace
) -> None:
    digest = push_for_key(client, repo, tag_for(namespace, KEY), KEY)
    policy = ATTESTED if namespace is Namespace.PREVIEW else Policy()
    if namespace is Namespace.PREVIEW and kind is Kind.MAIN:
        attest_preview(client, repo, KEY, GOOD, KEYRING, "linux/amd64")
        digest = client.lookup_tag(repo, PREVIEW).digest or ""
    out = find_image(client, repo, KEY, kind, policy)
    assert out.hit and out.source is namespace
    assert out.ref == ref(client, repo, digest)
    writes = {(w.tag, w.digest) for w in out.writes}
    if kind is Kind.MAIN and namespace is not Namespace.TRUSTED:
        # promotion (preview) or backfill (stable): the trusted tag now holds the same digest
        assert writes == {(TRUSTED, digest)}
        assert client.lookup_tag(repo, TRUSTED).digest == digest
    else:
        assert writes == set()
        assert TRUSTED not in client.list_tags(repo) or namespace is Namespace.TRUSTED


def test_backfill_keeps_digest_and_bytes(client: Registry, repo: str) -> None:
    digest = push_for_key(client, repo, STABLE_TAG, KEY)
    out = find_image(client, repo, KEY, Kind.MAIN)
    assert out.source is Namespace.STABLE
    assert client.lookup_tag(repo, TRUSTED).digest == digest
    assert client.manifest(repo, TRUSTED).raw == client.manifest(repo, STABLE_TAG).raw


def test_miss_says_where_to_push_and_writes_nothing(client: Registry, repo: str) -> None:
    push_image(client, repo, "unrelated", {"a": "b"})
    pr = find_image(client, repo, KEY, Kind.PR)
    main = find_image(client, repo, KEY, Kind.MAIN)
    assert not pr.hit and pr.push_tag == PREVIEW
    assert not main.hit and main.push_tag == TRUSTED
    assert [s.result for s in main.trace] == ["missing", "missing", "missing"]
    assert main.to_dict()["labels"] == {LABEL_HASH: KEY, LABEL_SCHEMA: "2"}
    assert client.list_tags(repo) == ["unrelated"]


@pytest.mark.parametrize("namespace", [Namespace.TRUSTED, Namespace.PREVIEW])
@pytest.mark.parametrize("labels", ["other-hash", "other-schema", "none"])
def test_mislabeled_content_tag_is_a_hard_failure(
    client: Registry, repo: str, namespace: Namespace, labels: str
) -> None:
    wrong = {
        "other-hash": {LABEL_HASH: OTHER, LABEL_SCHEMA: "2"},
        "other-schema": {LABEL_HASH: KEY, LABEL_SCHEMA: "1"},
        "none": {},
    }[labels]
    push_image(client, repo, tag_for(namespace, KEY), wrong)
    for kind in Kind:
        with pytest.raises(IdentityMismatch, match="must describe exactly its content"):
            find_image(client, repo, KEY, kind, ATTESTED)
    assert TRUSTED not in client.list_tags(repo) or namespace is Namespace.TRUSTED


def test_stale_stable_is_skipped(client: Registry, repo: str) -> None:
    old = push_for_key(client, repo, STABLE_TAG, OTHER)
    out = find_image(client, repo, KEY, Kind.MAIN)
    assert not out.hit
    assert out.stable == old  # what `promote stable --expect` needs
    stale = out.trace[-1]
    assert (stale.namespace, stale.result, stale.digest) == (Namespace.STABLE, "stale", old)
    assert LABEL_HASH in stale.reason
    assert TRUSTED not in client.list_tags(repo)


def test_preview_on_main_under_never_is_refused(client: Registry, repo: str) -> None:
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, GOOD, KEYRING, "linux/amd64")  # even attested
    out = find_image(client, repo, KEY, Kind.MAIN)  # default policy: never
    assert not out.hit and out.push_tag == TRUSTED
    assert out.trace[1].result == "refused" and "'never'" in out.trace[1].reason
    assert TRUSTED not in client.list_tags(repo)


def test_preview_on_main_attested_by_allowed_builder_is_promoted(
    client: Registry, repo: str
) -> None:
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, GOOD, KEYRING, "linux/amd64")
    preview = client.lookup_tag(repo, PREVIEW).digest
    out = find_image(client, repo, KEY, Kind.MAIN, ATTESTED)
    assert out.hit and out.source is Namespace.PREVIEW
    assert client.lookup_tag(repo, TRUSTED).digest == preview
    assert client.manifest(repo, TRUSTED).raw == client.manifest(repo, PREVIEW).raw
    assert out.trace[1].reason == f"attested by {GOOD!r}"


def test_preview_without_attestation_is_refused(client: Registry, repo: str) -> None:
    push_for_key(client, repo, PREVIEW, KEY)
    out = find_image(client, repo, KEY, Kind.MAIN, ATTESTED)
    assert not out.hit and "no builder attestation" in out.trace[1].reason
    assert TRUSTED not in client.list_tags(repo)


def test_planted_preview_from_untrusted_builder_is_refused(client: Registry, repo: str) -> None:
    # A fork PR with its own (valid) key and the right labels: not on the allow-list.
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, "fork/pr-42", KEYRING, "linux/amd64")
    out = find_image(client, repo, KEY, Kind.MAIN, ATTESTED)
    assert not out.hit
    assert "'fork/pr-42' is not in the allow-list" in out.trace[1].reason
    assert TRUSTED not in client.list_tags(repo)


def test_planted_preview_claiming_a_trusted_builder_is_refused(client: Registry, repo: str) -> None:
    # Claims the allowed builder id, but signs with a key it guessed.
    forged = attest.Keyring({GOOD: b"guessed-key-0123456789"})
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, GOOD, forged, "linux/amd64")
    out = find_image(client, repo, KEY, Kind.MAIN, ATTESTED)
    assert not out.hit and "does not verify" in out.trace[1].reason
    assert TRUSTED not in client.list_tags(repo)


def test_attestation_copied_onto_other_content_is_refused(client: Registry, repo: str) -> None:
    legit_repo = repo + "-legit"
    push_for_key(client, legit_repo, PREVIEW, KEY)
    attest_preview(client, legit_repo, KEY, GOOD, KEYRING, "linux/amd64")
    stolen = client.image_facts(legit_repo, client.lookup_tag(legit_repo, PREVIEW).digest or "")
    push_for_key(client, repo, PREVIEW, KEY, content=b"malicious", annotations=stolen.annotations)
    out = find_image(client, repo, KEY, Kind.MAIN, ATTESTED)
    assert not out.hit and "does not verify" in out.trace[1].reason
    assert TRUSTED not in client.list_tags(repo)


@pytest.mark.parametrize("where", ["/manifests/", f"/manifests/{PREVIEW}", "/blobs/"])
def test_registry_500_stops_the_lookup(
    proxy: FaultyProxy, client: Registry, repo: str, where: str
) -> None:
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, GOOD, KEYRING, "linux/amd64")
    before = client.list_tags(repo)
    proxy.rules.append(Rule("fail", path=where))
    via = Registry(proxy.url, timeout=2, retries=1, backoff=0.01)
    for kind in Kind:
        with pytest.raises(RegistryError, match="HTTP 500") as e:
            find_image(via, repo, KEY, kind, ATTESTED)
        assert "miss" not in [s.result for s in e.value.trace]
    assert client.list_tags(repo) == before  # no promotion, nothing pushed


def test_registry_timeout_stops_the_lookup(proxy: FaultyProxy, client: Registry, repo: str) -> None:
    proxy.rules.append(Rule("hang", path=f"/manifests/{PREVIEW}", seconds=30))
    via = Registry(proxy.url, timeout=0.3, retries=1, backoff=0.01)
    with pytest.raises(RegistryError, match="not a miss") as e:
        find_image(via, repo, KEY, Kind.PR)
    assert [(s.namespace, s.result) for s in e.value.trace] == [(Namespace.TRUSTED, "missing")]
    assert client.list_tags(repo) == []


def test_failed_promotion_write_is_an_error_not_a_hit(
    proxy: FaultyProxy, client: Registry, repo: str
) -> None:
    push_for_key(client, repo, PREVIEW, KEY)
    attest_preview(client, repo, KEY, GOOD, KEYRING, "linux/amd64")
    proxy.rules.append(Rule("fail", path=f"/manifests/{TRUSTED}", method="PUT"))
    via = Registry(proxy.url, timeout=2, retries=1, backoff=0.01)
    with pytest.raises(RegistryError, match="PUT"):
        find_image(via, repo, KEY, Kind.MAIN, ATTESTED)
    assert TRUSTED not in client.list_tags(repo)


def test_outcome_json_round_trips(client: Registry, repo: str) -> None:
    push_for_key(client, repo, TRUSTED, KEY)
    data = json.loads(json.dumps(find_image(client, repo, KEY, Kind.PR).to_dict()))
    assert data["outcome"] == "hit" and data["source"] == "trusted"
    assert data["trace"][0]["result"] == "hit"
