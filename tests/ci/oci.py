"""Synthetic OCI images for the integration tests: a config with labels and one gzipped layer,
pushed through the client under test (blobs, then the manifest)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import urllib.request
from collections.abc import Mapping

from ci.images.names import build_labels
from ci.images.registry import OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_MANIFEST, Registry


def layer(content: bytes) -> tuple[bytes, str]:
    """A deterministic tar.gz holding one file; returns (blob, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("payload.txt")
        info.size, info.mtime = len(content), 0
        tar.addfile(info, io.BytesIO(content))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), "sha256:" + hashlib.sha256(tar_bytes).hexdigest()


def push_image(
    client: Registry,
    repo: str,
    tag: str,
    labels: Mapping[str, str],
    *,
    content: bytes = b"payload",
    annotations: Mapping[str, str] | None = None,
) -> str:
    """Push a one-layer image with ``labels`` under ``tag``; returns the manifest digest."""
    blob, diff_id = layer(content)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": dict(labels)},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_bytes = json.dumps(config).encode()
    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": _descriptor(OCI_CONFIG, config_bytes, client.push_blob(repo, config_bytes)),
        "layers": [_descriptor(OCI_LAYER, blob, client.push_blob(repo, blob))],
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    return client.put_manifest(repo, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def push_for_key(client: Registry, repo: str, tag: str, key: str, **kwargs: object) -> str:
    """An image whose labels say it was built for ``key``."""
    return push_image(client, repo, tag, build_labels(key), **kwargs)  # type: ignore[arg-type]


def push_index(client: Registry, repo: str, tag: str, entries: Mapping[str, str]) -> str:
    """An image index of platform -> manifest digest (manifests already pushed)."""
    manifests = []
    for platform, digest in entries.items():
        raw = client.manifest(repo, digest).raw
        os_name, arch = platform.split("/")[:2]
        manifests.append(
            _descriptor(OCI_MANIFEST, raw, digest)
            | {"platform": {"os": os_name, "architecture": arch}}
        )
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    return client.put_manifest(repo, tag, json.dumps(index).encode(), OCI_INDEX)


def key_of(text: str) -> str:
    """A well-formed fake image key (the registry tests do not need a Dockerfile)."""
    return hashlib.sha256(text.encode()).hexdigest()


def _descriptor(media_type: str, data: bytes, digest: str) -> dict[str, object]:
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def delete_manifest(client: Registry, repo: str, digest: str) -> None:
    """Delete a manifest by digest; the registry drops every tag that points at it."""
    url = f"{client.url}/v2/{repo}/manifests/{digest}"
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10) as r:
        if r.status != 202:
            raise AssertionError(f"DELETE {url}: HTTP {r.status}")
