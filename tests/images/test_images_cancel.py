"""A client that hangs up mid-run: its batch stops at the next denoising step (the step
callback), the request counts as cancelled, and the server goes on serving."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.images.test_images_api import _metric


def _wait_for(predicate, what: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_disconnect_stops_the_run(sd, sd_server):
    steps = _metric(sd, "amity_image_steps_total")
    batches = _metric(sd, "amity_image_batches_total")
    cancels = _metric(sd, "friendli_failure_by_cancel")
    body = json.dumps({"prompt": "a slow fox", "num_inference_steps": 50, "width": 256,
                       "height": 256}).encode()
    with socket.create_connection(("127.0.0.1", sd_server.port)) as conn:
        conn.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _wait_for(lambda: _metric(sd, "amity_images_running") == 1, "the run to start")
    # Hung up: the run stops at its next step, well before its 50.
    _wait_for(lambda: _metric(sd, "amity_image_batches_total") == batches + 1, "the run to end")
    assert _metric(sd, "amity_image_steps_total") - steps < 50
    _wait_for(lambda: _metric(sd, "friendli_failure_by_cancel") == cancels + 1, "the cancel")
    assert _metric(sd, "friendli_current_requests") == 0
    res = sd.post("/v1/images/generations", json={"prompt": "p", "num_inference_steps": 2})
    assert res.status_code == 200


@pytest.mark.slow
def test_a_departed_request_leaves_its_batch_and_the_others_are_unchanged(sd, sd_server):
    """Two requests batched; one hangs up mid-run: its row is cut out at the next step
    (fewer steps run than two full images need), and the other's image is the same
    bytes as when it ran alone."""
    common = {"prompt": "a slow fox", "num_inference_steps": 40, "width": 128, "height": 128,
              "response_format": "raw"}
    steps = _metric(sd, "amity_image_steps_total")
    body = json.dumps({**common, "seed": 2}).encode()
    with ThreadPoolExecutor(1) as pool:
        with socket.create_connection(("127.0.0.1", sd_server.port)) as conn:
            conn.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            stays = pool.submit(sd.post, "/v1/images/generations", json={**common, "seed": 1})
            _wait_for(lambda: _metric(sd, "amity_images_running") == 2, "the batch to start")
        together = stays.result()
    assert together.status_code == 200, together.text
    assert _metric(sd, "amity_image_steps_total") - steps < 2 * 40
    alone = sd.post("/v1/images/generations", json={**common, "seed": 1})
    assert alone.json()["image"] == together.json()["image"]
