"""A real OCI registry for the integration tests: Debian's ``docker-registry`` on 127.0.0.1.

One registry per test session (filesystem storage in a temp dir, a config file written here,
a free port), stopped by PID at the end. Each test gets its own repository. If the binary is
missing the tests FAIL (they must run in CI; ``.ci/run`` installs the package).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ci.images.registry import Registry

from .faulty import FaultyProxy

BINARY_ENV = "CI_IMAGES_REGISTRY_BIN"
CONFIG = """\
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""
_repos = itertools.count()


def registry_binary() -> str:
    path = os.environ.get(BINARY_ENV) or shutil.which("docker-registry")
    if not path or not Path(path).is_file():
        pytest.fail(
            "the ci.images integration tests need a real registry: install the Debian package "
            "docker-registry (apt-get install -y docker-registry; .ci/run does this), or point "
            f"{BINARY_ENV} at a registry binary",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = registry_binary()
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(CONFIG.format(root=root / "storage", port=port), encoding="utf-8")
    url = f"http://127.0.0.1:{port}"
    with (root / "registry.log").open("wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
        try:
            _wait_ready(url, proc, root / "registry.log")
            yield url
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"docker-registry exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v2/", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"docker-registry did not answer on {url} within 30 s")


@pytest.fixture
def client(registry_url: str) -> Registry:
    return Registry(registry_url, timeout=5.0, retries=1, backoff=0.05)


@pytest.fixture
def repo(request: pytest.FixtureRequest) -> str:
    """A repository name no other test uses."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]
    return f"test/{name}-{next(_repos)}"


@pytest.fixture
def proxy(registry_url: str) -> Iterator[FaultyProxy]:
    """An HTTP proxy in front of the registry that fails, hangs or delays on command."""
    p = FaultyProxy(registry_url)
    try:
        yield p
    finally:
        p.close()
