"""Explicit promotion, attestation records, and the stable alias's compare-and-swap."""

from __future__ import annotations

import threading

import pytest

from ci.images import attest
from ci.images.errors import PromotionRefused, RegistryError, StableConflict
from ci.images.names import ANNOTATION_BUILDER, STABLE_TAG, Namespace, tag_for
from ci.images.promote import Mode, Policy, Write, attest_preview, move_stable, promote_preview
from ci.images.registry import Registry

from .faulty import FaultyProxy, Rule
from .oci import key_of, push_for_key

KEY, KEY2 = key_of("promote-1"), key_of("promote-2")
BUILDER = "ci/trusted-pr-builder"
KEYRING = attest.Keyring({BUILDER: bytes(range(32))})
ATTESTED = Policy(Mode.ATTESTED, frozenset({BUILDER}), KEYRING)
WINDOW = 0.4


def test_attestation_keeps_config_and_layers(client: Registry, repo: str) -> None:
    preview = tag_for(Namespace.PREVIEW, KEY)
    before = client.image_facts(repo, push_for_key(client, repo, preview, KEY))
    write = attest_preview(client, repo, KEY, BUILDER, KEYRING, "linux/amd64")
    after = client.image_facts(repo, write.digest)
    assert write.previous == before.digest and write.digest != before.digest
    assert after.config_digest == before.config_digest and after.labels == before.labels
    assert after.manifest.document()["layers"] == before.manifest.document()["layers"]
    assert after.annotations[ANNOTATION_BUILDER] == BUILDER
    assert attest.verifies(after.manifest.document(), KEY, KEYRING.keys[BUILDER])
    assert not attest.verifies(after.manifest.document(), KEY2, KEYRING.keys[BUILDER])


def test_attest_needs_the_builder_key(client: Registry, repo: str) -> None:
    push_for_key(client, repo, tag_for(Namespace.PREVIEW, KEY), KEY)
    with pytest.raises(PromotionRefused, match="no key for builder 'someone'"):
        attest_preview(client, repo, KEY, "someone", KEYRING, "linux/amd64")


def test_explicit_promotion_follows_the_policy(client: Registry, repo: str) -> None:
    push_for_key(client, repo, tag_for(Namespace.PREVIEW, KEY), KEY)
    with pytest.raises(PromotionRefused, match="'never'"):
        promote_preview(client, repo, KEY, Policy())
    with pytest.raises(PromotionRefused, match="no builder attestation"):
        promote_preview(client, repo, KEY, ATTESTED)
    attested = attest_preview(client, repo, KEY, BUILDER, KEYRING, "linux/amd64").digest
    write = promote_preview(client, repo, KEY, ATTESTED)
    assert write == Write(tag_for(Namespace.TRUSTED, KEY), attested, None, "preview")
    assert client.lookup_tag(repo, tag_for(Namespace.TRUSTED, KEY)).digest == attested


def test_trusted_tags_are_never_moved(client: Registry, repo: str) -> None:
    trusted = push_for_key(client, repo, tag_for(Namespace.TRUSTED, KEY), KEY, content=b"main")
    push_for_key(client, repo, tag_for(Namespace.PREVIEW, KEY), KEY, content=b"pr")
    attest_preview(client, repo, KEY, BUILDER, KEYRING, "linux/amd64")
    with pytest.raises(PromotionRefused, match="never moved"):
        promote_preview(client, repo, KEY, ATTESTED)
    assert client.lookup_tag(repo, tag_for(Namespace.TRUSTED, KEY)).digest == trusted


def test_policy_attested_needs_an_allow_list() -> None:
    with pytest.raises(ValueError, match="at least one allowed builder"):
        Policy(Mode.ATTESTED)


def test_keyring_parsing() -> None:
    ring = attest.Keyring.parse(f"a/b={'ab' * 16}, c={'cd' * 20}")
    assert ring.keys == {"a/b": b"\xab" * 16, "c": b"\xcd" * 20}
    for bad in ("nokey", f"x={'zz' * 16}", "x=abcd"):
        with pytest.raises(ValueError, match=attest.KEYS_ENV):
            attest.Keyring.parse(bad)


def test_stable_moves_only_from_the_expected_digest(client: Registry, repo: str) -> None:
    first = push_for_key(client, repo, tag_for(Namespace.TRUSTED, KEY), KEY, content=b"1")
    second = push_for_key(client, repo, tag_for(Namespace.TRUSTED, KEY2), KEY2, content=b"2")
    assert move_stable(client, repo, KEY, None, window_s=WINDOW).digest == first
    with pytest.raises(StableConflict, match="expected absent"):
        move_stable(client, repo, KEY2, None, window_s=WINDOW)
    assert client.lookup_tag(repo, STABLE_TAG).digest == first  # nothing written
    write = move_stable(client, repo, KEY2, first, window_s=WINDOW)
    assert (write.previous, write.digest) == (first, second)
    assert client.manifest(repo, STABLE_TAG).raw == client.manifest(repo, second).raw


def test_stable_takes_only_trusted_images(client: Registry, repo: str) -> None:
    push_for_key(client, repo, tag_for(Namespace.PREVIEW, KEY), KEY)
    with pytest.raises(PromotionRefused, match="stable only takes trusted images"):
        move_stable(client, repo, KEY, None, window_s=WINDOW)
    assert STABLE_TAG not in client.list_tags(repo)


def test_concurrent_stable_promotion_one_wins(
    registry_url: str, proxy: FaultyProxy, client: Registry, repo: str
) -> None:
    digests = {
        k: push_for_key(client, repo, tag_for(Namespace.TRUSTED, k), k, content=k.encode())
        for k in (KEY, KEY2)
    }
    # Both promoters read "absent" before either write lands; KEY's write lands first (0.1 s),
    # KEY2's later (0.5 s), so KEY2 is the last writer and must be the only winner.
    late = FaultyProxy(registry_url)
    path = f"/manifests/{STABLE_TAG}"
    proxy.rules.append(Rule("delay", path=path, method="PUT", seconds=0.1))
    late.rules.append(Rule("delay", path=path, method="PUT", seconds=0.5))
    barrier = threading.Barrier(2)
    results: dict[str, Write | Exception] = {}

    def promote(key: str, via: FaultyProxy) -> None:
        client = Registry(via.url, timeout=5, retries=0)
        barrier.wait()
        try:
            results[key] = move_stable(client, repo, key, None, window_s=1.5)
        except Exception as e:
            results[key] = e

    threads = [
        threading.Thread(target=promote, args=(KEY, proxy)),
        threading.Thread(target=promote, args=(KEY2, late)),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        late.close()
    assert isinstance(results[KEY2], Write), results
    assert isinstance(results[KEY], StableConflict), results
    assert "a concurrent promotion wrote after us and won" in str(results[KEY])
    assert proxy.count("PUT", STABLE_TAG) == late.count("PUT", STABLE_TAG) == 1  # both wrote
    assert client.lookup_tag(repo, STABLE_TAG).digest == digests[KEY2]


def test_stable_write_failure_is_reported_as_unknown(
    proxy: FaultyProxy, client: Registry, repo: str
) -> None:
    push_for_key(client, repo, tag_for(Namespace.TRUSTED, KEY), KEY)
    proxy.rules.append(Rule("fail", path=f"/manifests/{STABLE_TAG}", method="PUT"))
    via = Registry(proxy.url, timeout=2, retries=3, backoff=0.01)
    with pytest.raises(RegistryError, match="may or may not have moved"):
        move_stable(via, repo, KEY, None, window_s=WINDOW)
    assert proxy.count("PUT", f"/manifests/{STABLE_TAG}") == 1  # no blind retries in the swap
    assert STABLE_TAG not in client.list_tags(repo)
