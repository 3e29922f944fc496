"""`amity serve` as a user runs it: a real process started through the CLI, real sockets.

Two processes in all (each loads the model): one started with the documented flags
(`--port`), one with Friendli Container's spellings (`--hf-model-name`,
`--web-server-port`). Both are stopped with SIGTERM and must exit with code 0; the
first while a stream is in flight, which must still finish with `data: [DONE]`.
"""

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from amity.models.loader import default_model_path
from amity.suite.replicas.serve_command import listening_socket
from tests.server.conftest import free_port, sse_data

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 600  # model load is ~10-15 s; a busy shared box (kernel builds beside) needs far more
EXIT_TIMEOUT = 60
START_LINE = re.compile(r"^amity: serving (\S+) on (http://\S+)$")


class ServerProcess:
    """`python -m amity.cli serve ARGS`, its merged stdout/stderr collected by a thread."""

    def __init__(self, *args: str, pass_fds: tuple[int, ...] = ()):
        self.args = [sys.executable, "-m", "amity.cli", "serve", *args]
        self.pass_fds = pass_fds
        self.lines: list[str] = []
        self.health_before_ready: list[tuple[int, str]] = []
        self.proc: subprocess.Popen | None = None
        self._new_line = threading.Condition()

    def __enter__(self):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", pass_fds=self.pass_fds)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _read(self):
        for line in self.proc.stdout:
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self._new_line.notify_all()

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: re.Pattern, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new_line:
            while True:
                for line in self.lines[seen:]:
                    # tqdm's progress bar shares lines with \r; the last segment is what shows
                    if m := pattern.match(line.split("\r")[-1].strip()):
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and seen == len(self.lines)):
                    raise AssertionError(
                        f"no line matching {pattern.pattern!r} (exit code {self.proc.poll()}); "
                        f"output:\n{self.output()[-4000:]}")
                self._new_line.wait(timeout=min(left, 0.5))

    def poll_health_until_ready(self, url: str, timeout: float) -> None:
        """Every /health answer before the first 200 is recorded: the socket opens
        before the model has loaded, so those must be 503s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited:\n{self.output()[-4000:]}"
            try:
                res = httpx.get(f"{url}/health", timeout=5)
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            if res.status_code == 200:
                return
            self.health_before_ready.append((res.status_code, res.text))
            time.sleep(0.02)
        raise AssertionError(f"/health never became 200; output:\n{self.output()[-4000:]}")

    def terminate_and_wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {timeout} s after SIGTERM; output:\n{self.output()[-4000:]}"
            ) from None


@pytest.fixture(scope="module")
def served():
    port = free_port()
    with ServerProcess("--port", str(port), "--kv-cache-memory", "128MiB", "--compile", "false") as sp:
        sp.url = f"http://127.0.0.1:{port}"
        sp.poll_health_until_ready(sp.url, START_TIMEOUT)
        sp.start = sp.wait_for_line(START_LINE, 30)
        yield sp


def test_start_up_line_says_what_is_served_where(served):
    name, url = served.start.groups()
    assert url == served.url
    assert name == default_model_path().name.removesuffix(".gguf")
    assert httpx.get(f"{served.url}/v1/models").json()["data"][0]["id"] == name


def test_health_is_503_while_loading_then_200(served):
    assert served.health_before_ready, "never saw /health before the model had loaded"
    for status, text in served.health_before_ready:
        assert status == 503 and "loading" in text, (status, text)
    res = httpx.get(f"{served.url}/health")
    assert res.status_code == 200 and res.json() == {"status": "ok"}


def test_openai_sdk_completion(served):
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0,
                           timeout=60)
    name = served.start.group(1)
    out = client.completions.create(model=name, prompt="The capital of France is",
                                    max_tokens=4, temperature=0)
    assert out.object == "text_completion" and out.model == name
    [choice] = out.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert out.usage.completion_tokens == len(choice.model_extra["tokens"]) <= 4
    assert out.usage.prompt_tokens > 0


def test_sigterm_drains_a_stream_in_flight_and_exits_0(served):
    """Must run last against `served`: it stops the process."""
    max_tokens = 48
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "min_tokens": max_tokens,
            "stream": True}
    chunks: list[str] = []
    with httpx.Client(base_url=served.url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as res:
            assert res.status_code == 200
            lines = res.iter_lines()
            for line in lines:  # the stream has begun: the first token is out
                if line.startswith("data: "):
                    chunks.append(line[len("data: "):])
                    break
            sent = time.monotonic()
            served.proc.send_signal(signal.SIGTERM)
            rest = "\n".join(lines)
    chunks += sse_data(rest)
    assert chunks[-1] == "[DONE]", chunks[-3:]
    tokens = [c for c in chunks[:-1] if '"token":' in c and '"token":null' not in c]
    assert len(tokens) == max_tokens, f"{len(tokens)} tokens streamed of {max_tokens}"
    assert '"finish_reason":"length"' in chunks[-2]
    try:
        code = served.proc.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after SIGTERM:\n{served.output()[-4000:]}") from None
    assert code == 0, f"exit code {code}; output:\n{served.output()[-4000:]}"
    assert time.monotonic() - sent < EXIT_TIMEOUT
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{served.url}/health", timeout=2)


def test_friendli_aliases_hf_model_name_and_web_server_port(tmp_path):
    # A distinct file name shows that --hf-model-name, not the default, was loaded.
    model = tmp_path / "friendli-alias-model.gguf"
    model.symlink_to(default_model_path())
    port = free_port()
    with ServerProcess("--hf-model-name", str(model), "--web-server-port", str(port),
                       "--kv-cache-memory", "128MiB", "--compile", "false") as sp:
        url = f"http://127.0.0.1:{port}"
        sp.poll_health_until_ready(url, START_TIMEOUT)
        name, where = sp.wait_for_line(START_LINE, 30).groups()
        assert (name, where) == ("friendli-alias-model", url)
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == name
        res = httpx.post(f"{url}/v1/completions",
                         json={"model": name, "prompt": "Hi", "max_tokens": 2})
        assert res.status_code == 200 and len(res.json()["choices"][0]["tokens"]) <= 2
        code = sp.terminate_and_wait()
        assert code == 0, f"exit code {code}; output:\n{sp.output()[-4000:]}"


def test_uds_serves_beside_the_port_replaces_a_stale_socket_and_goes_at_exit(tmp_path):
    """`--uds`: the Suite reaches its local replicas over a Unix socket. The port is
    still served; a socket file a killed server left is replaced; the file is the
    owner's alone, and removed when the server exits."""
    path = tmp_path / "replica.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, with nothing listening: a killed server's
    port = free_port()
    with ServerProcess("--port", str(port), "--uds", str(path), "--kv-cache-memory", "128MiB",
                       "--compile", "false") as sp:
        url = f"http://127.0.0.1:{port}"
        sp.poll_health_until_ready(url, START_TIMEOUT)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=120) as over_socket:
            assert over_socket.get("http://replica/health").status_code == 200
            res = over_socket.post("http://replica/v1/completions",
                                   json={"prompt": "Hi", "max_tokens": 2})
        assert res.status_code == 200 and len(res.json()["choices"][0]["tokens"]) <= 2
        code = sp.terminate_and_wait()
        assert code == 0, f"exit code {code}; output:\n{sp.output()[-4000:]}"
    assert not path.exists()


@pytest.mark.slow
def test_sigterm_while_the_model_loads_and_compiles_exits_at_once():
    """Issue 13 (defect 16): SIGTERM during model load or `--compile` waited for the load
    to end (minutes for a first compile). The socket is open and /health says the model
    is loading: SIGTERM then ends the process within seconds, with code 0."""
    port = free_port()
    with ServerProcess("--port", str(port), "--compile", "--kv-cache-memory", "128MiB") as sp:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while not sp.health_before_ready:  # the first 503 "loading"
            assert time.monotonic() < deadline and sp.proc.poll() is None, sp.output()[-4000:]
            try:
                res = httpx.get(f"{url}/health", timeout=5)
                assert res.status_code == 503, "loaded before SIGTERM could be sent"
                sp.health_before_ready.append((res.status_code, res.text))
            except httpx.TransportError:
                time.sleep(0.05)
        code = sp.terminate_and_wait(timeout=20)
        assert code == 0, f"exit code {code}; output:\n{sp.output()[-4000:]}"


def test_fd_serves_on_an_inherited_listening_socket():
    """`--fd`: the Suite binds a replica's port itself and hands the listening socket
    over, so no other process can take the port between its choice and the server's
    start (seconds of imports, more on a loaded machine)."""
    listener = listening_socket("127.0.0.1")
    port = listener.getsockname()[1]
    with ServerProcess("--fd", str(listener.fileno()), "--kv-cache-memory", "128MiB",
                       "--compile", "false", pass_fds=(listener.fileno(),)) as sp:
        listener.close()  # the child's copy alone holds the port from here on
        with pytest.raises(OSError), socket.socket() as intruder:
            intruder.bind(("127.0.0.1", port))
        url = f"http://127.0.0.1:{port}"
        sp.poll_health_until_ready(url, START_TIMEOUT)
        assert sp.wait_for_line(START_LINE, 30).group(2) == url
        res = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert res.status_code == 200 and len(res.json()["choices"][0]["tokens"]) <= 2
        code = sp.terminate_and_wait()
        assert code == 0, f"exit code {code}; output:\n{sp.output()[-4000:]}"
