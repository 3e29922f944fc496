"""`amity serve --model DIFFUSERS_DIR` as a user runs it: a real process through the
CLI serves the image routes, refuses the text ones naming its task, and exits 0 on
SIGTERM."""

import base64
import io

import httpx
import pytest
from PIL import Image

from tests.server.conftest import free_port
from tests.server.test_process import START_LINE, START_TIMEOUT, ServerProcess


@pytest.mark.slow
def test_amity_serve_a_diffusers_directory(model_dirs):
    port = free_port()
    with ServerProcess("--model", str(model_dirs["sd"]), "--port", str(port),
                       "--max-num-seqs", "4", "--served-model-name", "tiny-sd") as sp:
        url = f"http://127.0.0.1:{port}"
        sp.poll_health_until_ready(url, START_TIMEOUT)
        assert sp.wait_for_line(START_LINE, 30).groups() == ("tiny-sd", url)
        res = httpx.post(f"{url}/v1/images/generations", timeout=120, json={
            "prompt": "a red fox", "num_inference_steps": 2, "model": "tiny-sd"})
        assert res.status_code == 200, res.text
        assert Image.open(io.BytesIO(base64.b64decode(res.json()["image"]))).format == "JPEG"
        res = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                         json={"messages": [{"role": "user", "content": "hi"}]})
        assert res.status_code == 400 and "image generation" in res.text
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny-sd"
        assert sp.terminate_and_wait() == 0
