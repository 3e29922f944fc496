"""What the endpoint tests share: a model registry holding a tiny random-weight
chat model (built by tests/conftest.py, a chat template added), a Suite process
configured to act quickly (short ticks and timeouts, small replicas), and helpers
that wait for states."""

import json
import shutil
import time
from pathlib import Path

import httpx

from tests.suite.conftest import SuiteProcess

TINY_REPO = "acme/tiny-chat"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SUITE_FLAGS = ("--autoscale-interval-s", "0.3", "--replica-args",
               "--kv-cache-memory 32MiB --num-threads 1 --compile false", "--queue-timeout-s", "2",
               "--target-outstanding", "1", "--wake-timeout-s", "240")
ADVANCED = {"tokenizer_skip_special_tokens": True, "tokenizer_add_special_tokens": False,
            "max_token_count": 512}


def build_registry(root: Path, tiny_model: Path) -> Path:
    target = root / TINY_REPO
    shutil.copytree(tiny_model, target)
    config_file = target / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config))
    return root


def start_suite(data_dir: Path, registry: Path, *extra: str, timeout_s: float = 60) -> SuiteProcess:
    return SuiteProcess(data_dir, "--model-registry", str(registry), *SUITE_FLAGS,
                        *extra).start(timeout_s)


def create_body(project_id: str, repo: str = TINY_REPO, **extra) -> dict:
    return {"projectId": project_id, "name": "tiny", "instanceOptionId": "cpu",
            "advanced": ADVANCED, "hfModelRepo": repo, **extra}


def wait_status(http: httpx.Client, endpoint_id: str, wanted: set[str], timeout_s: float = 300,
                headers: dict | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = http.get(f"/dedicated/beta/endpoint/{endpoint_id}/status", headers=headers)
        assert status.status_code == 200, status.text
        if status.json()["status"] in wanted:
            return status.json()
        assert time.monotonic() < deadline, f"still {status.json()} after {timeout_s} s"
        time.sleep(0.3)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.3)


def serve_pids(*args: str) -> list[int]:
    """The `amity serve` processes (replicas) whose command line has all of `args`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"serve" in argv and all(a.encode() in argv for a in args):
            pids.append(int(entry.name))
    return pids
