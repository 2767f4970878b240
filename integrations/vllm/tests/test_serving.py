"""vLLM's OpenAI server on the bridge, checked with real clients on loopback.

One server per backend (module scope) answers every test of that backend, in file order; the
last test stops it with SIGTERM in the middle of a stream. Faults tried, each must hold (the
server answers with vLLM's error or ends cleanly, and the next request still works):
  1 a prompt longer than the model, 2 an empty prompt, 3 a client gone mid-stream,
  4 SIGTERM during a stream (the server ends, no process of it is left).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from plugin_api_vllm.generate import PROMPTS
from plugin_api_vllm.serving import Server, free_port
from plugin_api_vllm.tiny_model import Shape, build

pytestmark = [pytest.mark.needs_vllm, pytest.mark.serving]

BRIDGED = ("cpu-arm-acl", "reference")
NAME = "tiny-llama"
# the offline runs' settings (plugin_api_vllm.generate): fp32, eager, 1024 positions
ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"]


@dataclass
class Served:
    backend: str
    server: Server
    ready: subprocess.CompletedProcess[str]  # the readiness tool, run while the model loaded

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.server.url}/v1", api_key="unused", max_retries=0)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.server.url}/metrics", timeout=10).text
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for line in text.splitlines():
            if line.startswith(name + "{") and all(w in line for w in want):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"/metrics has no {name} {labels}")


def ready_tool(url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "plugin_api_vllm.ready", url, *args, "--timeout", str(timeout)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)


def start(model: Path, args: list[str], env: dict[str, str], log: Path) -> Served:
    server = Server(model, args, env, log, name=NAME)
    # as a deployment waits: the readiness tool, started while the model is still loading
    ready = ready_tool(server.url, "--model", NAME)
    if ready.returncode != 0:
        server.stop()
        pytest.fail(f"the server never became ready:\n{ready.stderr}\n{server.tail()}")
    return Served(env.get("PLUGIN_API_BACKEND", "vllm"), server, ready)


def stop(served: Served) -> None:
    survivors = served.server.stop()
    assert survivors == [], f"left running after SIGTERM: {survivors}\n{served.server.tail()}"


@pytest.fixture(scope="module", params=BRIDGED)
def served(
    request: pytest.FixtureRequest,
    tiny_models: dict[str, Path],
    env: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    backend = request.param
    log = tmp_path_factory.mktemp("serve") / f"{backend}.log"
    s = start(
        tiny_models["llama"], ARGS, env(PLUGIN_API_BACKEND=backend, PLUGIN_API_STRICT="1"), log
    )
    yield s
    stop(s)


def completion_tokens(served: Served, prompt: str | list[int], stream: bool) -> list[int]:
    params: dict[str, Any] = {"model": NAME, "prompt": prompt, "max_tokens": 32}
    params |= {"temperature": 0.0, "extra_body": {"return_token_ids": True}}
    client = served.client()
    if not stream:
        return list(client.completions.create(**params).choices[0].token_ids)
    tokens: list[int] = []
    for chunk in client.completions.create(stream=True, **params):
        tokens += chunk.choices[0].model_extra.get("token_ids") or []
    return tokens


def test_readiness_waited_while_the_model_loaded(served: Served) -> None:
    # the tool started before the server listened: it said so, retried, then passed all stages
    assert "not ready: waiting for health" in served.ready.stderr
    assert served.ready.stdout.startswith(f"ready: {NAME} answers at {served.server.url}")


def test_readiness_names_the_stage_that_fails(served: Served) -> None:
    other = ready_tool(served.server.url, "--model", "another-model", timeout=20)
    assert other.returncode == 4, other.stderr
    assert f"model failed: the server serves ['{NAME}'], not 'another-model'" in other.stderr
    with_key = ready_tool(served.server.url, "--model", NAME, "--api-key", "k", timeout=20)
    assert with_key.returncode == 0  # vLLM without --api-key ignores a bearer token


def test_readiness_with_nothing_listening_fails_at_health() -> None:
    r = ready_tool(f"http://127.0.0.1:{free_port()}", timeout=2)
    assert r.returncode == 3
    assert "health failed: cannot connect" in r.stderr


def test_models_lists_the_served_model(served: Served) -> None:
    assert [m.id for m in served.client().models.list().data] == [NAME]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "sse"])
def test_completions_equal_the_offline_run(served: Served, runs: Any, stream: bool) -> None:
    offline = runs.get(served.backend, kinds=("llama",))["llama"]["tokens"]
    assert [completion_tokens(served, p, stream) for p in PROMPTS] == offline


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "sse"])
def test_chat_completions_equal_completions_of_the_rendered_prompt(
    served: Served, stream: bool
) -> None:
    client = served.client()
    params: dict[str, Any] = {"model": NAME, "max_tokens": 32, "temperature": 0.0}
    params["extra_body"] = {"return_token_ids": True}
    for text in PROMPTS[:2]:
        messages = [{"role": "user", "content": text}]
        whole = client.chat.completions.create(messages=messages, **params)
        prompt_ids = whole.model_extra["prompt_token_ids"]
        if stream:
            tokens: list[int] = []
            for chunk in client.chat.completions.create(messages=messages, stream=True, **params):
                if chunk.choices:
                    tokens += chunk.choices[0].model_extra.get("token_ids") or []
        else:
            tokens = list(whole.choices[0].model_extra["token_ids"])
        # the chat template's tokens, sent as a plain completion, give the same greedy tokens
        assert tokens == completion_tokens(served, prompt_ids, stream=False)


def test_concurrent_streaming_clients_get_every_token(served: Served) -> None:
    # the load run's client (plugin_api_vllm.load), small: 3 clients, 6 requests
    from plugin_api_vllm.load import run_load

    result = run_load(served.server.url, NAME, side=served.backend, clients=3, requests=6)
    assert result.errors == 0, result.error_samples
    assert result.tokens == 6 * 32


def test_fault_1_prompt_longer_than_the_model_gets_vllms_error(served: Served) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024 tokens"):
        served.client().completions.create(model=NAME, prompt="x" * 1100, max_tokens=4)
    assert completion_tokens(served, PROMPTS[0], stream=False)  # the next request works


def test_fault_2_empty_prompt_gets_vllms_error(served: Served) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match=r"parameter=prompt"):
        served.client().completions.create(model=NAME, prompt="", max_tokens=4)
    assert completion_tokens(served, PROMPTS[0], stream=True)


def test_fault_3_client_gone_mid_stream_is_aborted(served: Served) -> None:
    generated = served.metric("vllm:generation_tokens_total")
    body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 900, "ignore_eos": True}
    body |= {"stream": True, "temperature": 0.0}
    events = 0
    with httpx.stream("POST", f"{served.server.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leaving the block closes the connection mid-stream
    # the server drains the request (vLLM usually drops it at once; now and then its HTTP
    # layer misses the disconnect and it runs to max_tokens: seconds here, so both are waited)
    deadline = time.monotonic() + 60
    while served.metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served.metric("vllm:num_requests_running") == 0
    assert served.metric("vllm:generation_tokens_total") - generated <= 900
    assert completion_tokens(served, PROMPTS[0], stream=False)
    assert [m.id for m in served.client().models.list().data] == [NAME]


def test_fault_4_sigterm_during_a_stream_ends_cleanly(served: Served) -> None:
    # the module's last test on this server: SIGTERM, as a container runtime sends on stop.
    # vLLM 0.32 (default --shutdown-timeout 0) kills its engine at once; its HTTP server then
    # waits for open streams to close, and a cut stream may get no final event: a client needs
    # a read timeout (15 s here), after which the server ends with nothing left running.
    body = {"model": NAME, "prompt": PROMPTS[2], "max_tokens": 700, "ignore_eos": True}
    body |= {"stream": True, "temperature": 0.0}
    seen: dict[str, Any] = {"events": 0, "end": None}
    started = threading.Event()

    def read() -> None:
        try:
            url = f"{served.server.url}/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=15) as r:
                for line in r.iter_lines():
                    seen["events"] += line.startswith("data: ")
                    if seen["events"] == 2:
                        started.set()
            seen["end"] = "closed"
        except httpx.HTTPError as e:
            seen["end"] = type(e).__name__
        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(60), "the stream never started"
    served.server.proc.send_signal(signal.SIGTERM)
    reader.join(60)
    assert not reader.is_alive(), "the client's stream never ended after SIGTERM"
    assert seen["end"] is not None and seen["events"] >= 2
    assert served.server.proc.wait(60) is not None
    stop(served)  # no process of the server's group is left


# -- SSE keep-alive (S8): a prefill of several seconds, comments keep the stream alive ----------

# prefill of the long prompt takes seconds on two cores (fp32, 116M parameters)
SLOW = Shape(
    layers=8, hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=1024, max_positions=4096
)
LONG_PROMPT = ("The keep-alive comment holds the line open while the model reads. " * 60)[:3500]


@pytest.fixture(scope="module")
def slow_served(env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("slow")
    model = build("llama", root / "model", SLOW)
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "4096"]
    args += ["--sse-keep-alive-interval", "1", "--no-enable-prefix-caching"]
    s = start(
        model, args, env(PLUGIN_API_BACKEND="cpu-arm-acl", PLUGIN_API_STRICT="1"), root / "log"
    )
    yield s
    stop(s)


def test_sse_keep_alive_comments_precede_the_first_token(slow_served: Served) -> None:
    body = {"model": NAME, "prompt": LONG_PROMPT, "max_tokens": 6, "temperature": 0.0}
    body |= {"stream": True, "return_token_ids": True}
    t0 = time.monotonic()
    before_data: list[str] = []
    first_data_s = None
    tokens: list[int] = []
    url = f"{slow_served.server.url}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                if first_data_s is None:
                    first_data_s = time.monotonic() - t0
                if line != "data: [DONE]":
                    import json

                    tokens += json.loads(line[6:])["choices"][0].get("token_ids") or []
            elif first_data_s is None and line:
                before_data.append(line)
    assert first_data_s is not None
    if first_data_s < 2.5:
        pytest.skip(f"the prefill took {first_data_s:.1f} s here: too fast to need a keep-alive")
    comments = [line for line in before_data if re.fullmatch(r": keep-alive", line)]
    assert len(comments) >= int(first_data_s) - 1 >= 1, (first_data_s, before_data)
    assert before_data == comments  # nothing but comments before the first event

    # an SSE-compliant client skips the comments and gets exactly the tokens (that streams and
    # whole answers agree: test_completions_equal_the_offline_run)
    client = slow_served.client()
    params: dict[str, Any] = {"model": NAME, "prompt": LONG_PROMPT, "max_tokens": 6}
    params |= {"temperature": 0.0, "extra_body": {"return_token_ids": True}}
    streamed: list[int] = []
    for chunk in client.completions.create(stream=True, **params):
        streamed += chunk.choices[0].model_extra.get("token_ids") or []
    assert tokens == streamed and len(streamed) == 6
