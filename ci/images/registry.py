"""A small OCI distribution client (standard library HTTP only).

What base-image reuse needs and no more: resolve a tag to a digest with a three-way answer
(found / missing / registry error), read manifests and config labels by digest (verified against
the digest), add a tag by re-putting the identical manifest bytes (so the digest cannot change),
list tags, and push blobs and manifests. Transient failures (connection errors, timeouts, HTTP
5xx and 429) are retried with backoff; a registry that still fails is a ``RegistryError``, never
an answer. Anonymous, basic and bearer-token (``WWW-Authenticate``) access are supported.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

from .errors import RegistryError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPO = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_TRANSIENT = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)


class State(str, enum.Enum):
    FOUND = "found"
    MISSING = "missing"
    ERROR = "registry-error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class TagLookup:
    """A tag lookup: FOUND with the digest, MISSING, or ERROR with what went wrong."""

    state: State
    digest: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Manifest:
    digest: str
    media_type: str
    raw: bytes  # exactly as served; its sha256 is ``digest``

    def document(self) -> dict[str, Any]:
        doc = json.loads(self.raw)
        if not isinstance(doc, dict):
            raise RegistryError(f"manifest {self.digest} is not a JSON object")
        return doc


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """What identifies an image: its digest, config labels and manifest annotations."""

    digest: str  # of what the tag points at (an image manifest or an index)
    manifest: Manifest
    config_digest: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]  # of the top-level manifest


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    headers: Message
    body: bytes

    def error_text(self) -> str:
        text = self.body[:300].decode("utf-8", "replace").strip()
        return f"HTTP {self.status}" + (f": {text}" if text else "")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """One registry endpoint, e.g. ``Registry("http://127.0.0.1:5000")``.

    ``timeout``: seconds per request; ``retries``: extra attempts after a transient failure,
    waiting ``backoff * 2**n`` seconds; ``credentials``: (user, password) for basic auth or the
    token service.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"registry url must be http(s)://host[:port], got {url!r}")
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.host = parsed.netloc
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.credentials = credentials
        self._authorization: str | None = None
        self._opener = urllib.request.build_opener(_NoRedirectForWrites())

    def ref(self, repo: str, digest: str) -> str:
        """The pullable reference ``host/repo@sha256:...``."""
        return f"{self.host}/{repo}@{digest}"

    # --- reads -----------------------------------------------------------------------------

    def lookup_tag(self, repo: str, tag: str) -> TagLookup:
        """Tag -> digest. Never raises for registry trouble: that is ``State.ERROR``."""
        _check_repo(repo)
        _check_tag(tag)
        try:
            reply = self._call("HEAD", f"/v2/{repo}/manifests/{tag}", headers=_ACCEPT)
        except RegistryError as e:
            return TagLookup(State.ERROR, detail=str(e))
        if reply.status == 404:
            return TagLookup(State.MISSING, detail=f"{repo}:{tag} does not exist")
        if reply.status != 200:
            return TagLookup(State.ERROR, detail=f"HEAD {repo}:{tag}: HTTP {reply.status}")
        digest = reply.headers.get("Docker-Content-Digest")
        if digest is None:  # some registries omit it on HEAD: hash what GET serves
            try:
                digest = self.manifest(repo, tag).digest
            except RegistryError as e:
                return TagLookup(State.ERROR, detail=str(e))
        if not _DIGEST.match(digest):
            return TagLookup(State.ERROR, detail=f"{repo}:{tag}: malformed digest {digest!r}")
        return TagLookup(State.FOUND, digest)

    def manifest(self, repo: str, reference: str) -> Manifest:
        """The manifest bytes of ``reference`` (tag or digest), checked against the digest."""
        _check_repo(repo)
        reply = self._call("GET", f"/v2/{repo}/manifests/{reference}", headers=_ACCEPT)
        if reply.status != 200:
            raise RegistryError(f"GET manifest {repo}@{reference}: {reply.error_text()}")
        digest = sha256_digest(reply.body)
        claimed = reply.headers.get("Docker-Content-Digest")
        expected = reference if _DIGEST.match(reference) else claimed
        if expected is not None and expected != digest:
            raise RegistryError(f"manifest {repo}@{reference} has digest {digest}, not {expected}")
        media_type = reply.headers.get_content_type()
        if media_type not in MANIFEST_TYPES:
            media_type = str(json.loads(reply.body).get("mediaType", media_type))
        return Manifest(digest, media_type, reply.body)

    def blob(self, repo: str, digest: str) -> bytes:
        _check_repo(repo)
        _check_digest(digest)
        reply = self._call("GET", f"/v2/{repo}/blobs/{digest}")
        if reply.status != 200:
            raise RegistryError(f"GET blob {repo}@{digest}: {reply.error_text()}")
        if sha256_digest(reply.body) != digest:
            raise RegistryError(f"blob {repo}@{digest}: content does not match its digest")
        return reply.body

    def image_facts(self, repo: str, digest: str, *, platform: str = "linux/amd64") -> ImageFacts:
        """Labels and annotations of the immutable ``repo@digest`` (an index picks ``platform``)."""
        top = self.manifest(repo, digest)
        doc = top.document()
        image = top
        if top.media_type in INDEX_TYPES:
            entry = _platform_entry(doc, platform, f"{repo}@{digest}")
            image = self.manifest(repo, entry)
        try:
            config_digest = str(image.document()["config"]["digest"])
            config = json.loads(self.blob(repo, config_digest))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise RegistryError(f"{repo}@{digest}: unreadable image config ({e})") from e
        labels = (config.get("config") or {}).get("Labels") or {}
        return ImageFacts(
            digest, top, config_digest, dict(labels), dict(doc.get("annotations") or {})
        )

    def list_tags(self, repo: str) -> list[str]:
        _check_repo(repo)
        tags: list[str] = []
        path: str | None = f"/v2/{repo}/tags/list?n=1000"
        while path:
            reply = self._call("GET", path)
            if reply.status == 404:
                return tags  # the repository does not exist yet
            if reply.status != 200:
                raise RegistryError(f"GET tags of {repo}: {reply.error_text()}")
            tags += json.loads(reply.body).get("tags") or []
            path = _next_link(reply.headers.get("Link"))
        return sorted(tags)

    # --- writes ----------------------------------------------------------------------------

    def put_manifest(
        self,
        repo: str,
        reference: str,
        raw: bytes,
        media_type: str,
        *,
        retries: int | None = None,
        timeout: float | None = None,
    ) -> str:
        """PUT ``raw`` under a tag (or its digest); returns the digest, checked against ``raw``."""
        _check_repo(repo)
        if not _DIGEST.match(reference):
            _check_tag(reference)
        reply = self._call(
            "PUT",
            f"/v2/{repo}/manifests/{reference}",
            body=raw,
            headers={"Content-Type": media_type},
            retries=retries,
            timeout=timeout,
        )
        if reply.status not in (200, 201):
            raise RegistryError(f"PUT manifest {repo}:{reference}: {reply.error_text()}")
        digest = sha256_digest(raw)
        served = reply.headers.get("Docker-Content-Digest")
        if served is not None and served != digest:
            raise RegistryError(f"registry stored {repo}:{reference} as {served}, not {digest}")
        return digest

    def add_tag(self, repo: str, digest: str, tag: str) -> str:
        """Point ``tag`` at ``digest`` by re-putting the identical manifest bytes, then verify."""
        manifest = self.manifest(repo, digest)
        self.put_manifest(repo, tag, manifest.raw, manifest.media_type)
        after = self.lookup_tag(repo, tag)
        if after.state is not State.FOUND or after.digest != digest:
            raise RegistryError(
                f"after tagging {repo}:{tag} -> {digest} the tag reads {after.state} "
                f"{after.digest or after.detail}"
            )
        return digest

    def push_blob(self, repo: str, data: bytes) -> str:
        """Upload ``data`` (monolithic) unless the registry has it already; returns its digest."""
        _check_repo(repo)
        digest = sha256_digest(data)
        head = self._call("HEAD", f"/v2/{repo}/blobs/{digest}")
        if head.status == 200:
            return digest
        start = self._call("POST", f"/v2/{repo}/blobs/uploads/", body=b"")
        location = start.headers.get("Location")
        if start.status != 202 or not location:
            raise RegistryError(f"POST upload {repo}: {start.error_text()}")
        url = urllib.parse.urljoin(self.url + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        done = self._call(
            "PUT", url, body=data, headers={"Content-Type": "application/octet-stream"}
        )
        if done.status != 201:
            raise RegistryError(f"PUT blob {repo}@{digest}: {done.error_text()}")
        return digest

    # --- transport -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retries: int | None = None,
        timeout: float | None = None,
    ) -> _Reply:
        url = path if path.startswith(("http://", "https://")) else self.url + path
        timeout = self.timeout if timeout is None else timeout
        attempts = 1 + (self.retries if retries is None else retries)
        failures = 0
        authorized = False
        while True:
            try:
                reply = self._send(method, url, body, dict(headers or {}), timeout)
            except _TRANSIENT as e:
                last = _describe(e)
            else:
                if reply.status == 401 and not authorized and self._authorize(reply):
                    authorized = True  # answering the challenge is not a failed attempt
                    continue
                if reply.status < 500 and reply.status != 429:
                    return reply
                last = reply.error_text()
            failures += 1
            if failures >= attempts:
                break
            time.sleep(self.backoff * 2 ** (failures - 1))
        raise RegistryError(
            f"{method} {url}: {last} (gave up after {attempts} attempt(s), timeout {timeout:g} s)"
        )

    def _send(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> _Reply:
        if self._authorization:
            headers.setdefault("Authorization", self._authorization)
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=timeout) as r:
                return _Reply(r.status, r.headers, r.read())
        except urllib.error.HTTPError as e:
            with e:
                return _Reply(e.code, e.headers, e.read())

    def _authorize(self, reply: _Reply) -> bool:
        """Answer a 401 challenge (basic or bearer); False when there is nothing to try."""
        challenge = reply.headers.get("WWW-Authenticate", "")
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic" and self.credentials:
            self._authorization = "Basic " + _basic(self.credentials)
            return True
        if scheme.lower() != "bearer":
            return False
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.pop("realm", None)
        if not realm:
            return False
        query = urllib.parse.urlencode(
            {k: v for k, v in fields.items() if k in ("service", "scope")}
        )
        headers = {"Authorization": "Basic " + _basic(self.credentials)} if self.credentials else {}
        request = urllib.request.Request(f"{realm}?{query}", headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as r:
                doc = json.loads(r.read())
        except (*_TRANSIENT, json.JSONDecodeError) as e:
            raise RegistryError(f"token request to {realm} failed: {_describe(e)}") from e
        token = doc.get("token") or doc.get("access_token")
        if not token:
            raise RegistryError(f"token service {realm} returned no token")
        self._authorization = f"Bearer {token}"
        return True


class _NoRedirectForWrites(urllib.request.HTTPRedirectHandler):
    """Follow redirects for GET/HEAD (blob storage), never silently for writes."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if req.get_method() not in ("GET", "HEAD"):
            return None
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != req.host:
            new.remove_header("Authorization")  # never hand registry credentials to storage
        return new


_ACCEPT = {"Accept": ", ".join(MANIFEST_TYPES)}


def _platform_entry(index: dict[str, Any], platform: str, where: str) -> str:
    want = platform.split("/")
    for entry in index.get("manifests") or []:
        p = entry.get("platform") or {}
        have = [p.get("os"), p.get("architecture")] + ([p["variant"]] if p.get("variant") else [])
        if have[: len(want)] == want and len(want) >= 2:
            return str(entry["digest"])
    raise RegistryError(f"{where}: index has no manifest for platform {platform}")


def _next_link(link: str | None) -> str | None:
    if not link:
        return None
    m = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link)
    return m.group(1) if m else None


def _basic(credentials: tuple[str, str] | None) -> str:
    user, password = credentials or ("", "")
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _describe(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return f"{type(e).__name__}: {reason if reason is not None else e}"


def _check_repo(repo: str) -> None:
    if not _REPO.match(repo):
        raise ValueError(f"repository name {repo!r} is not a valid OCI repository name")


def _check_tag(tag: str) -> None:
    if not _TAG.match(tag):
        raise ValueError(f"tag {tag!r} is not a valid OCI tag")


def _check_digest(digest: str) -> None:
    if not _DIGEST.match(digest):
        raise ValueError(f"digest {digest!r} is not sha256:<64 hex>")
