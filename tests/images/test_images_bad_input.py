"""Every bad image request is a 422 (400 for the wrong kind of model) that names the
field and says why, URL inputs never reach private addresses, and the server keeps
serving after each."""

import base64
import io

import pytest
from PIL import Image

from tests.images.conftest import png_bytes

GEN = "/v1/images/generations"
EDIT = "/v1/images/edits"
PNG = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()


def _edit_with(url: str) -> dict:
    return {"prompt": "p", "num_inference_steps": 2, "image": {"image": url}}


def _check(client, path, body, status, says):
    res = client.post(path, json=body)
    assert res.status_code == status, res.text
    detail = res.json()["detail"][0]
    assert says in detail["msg"], detail
    return detail


@pytest.mark.parametrize("body, says, loc", [
    ({"prompt": "p", "num_inference_steps": 0}, "greater than or equal to 1",
     ["body", "num_inference_steps"]),
    ({"prompt": "p", "num_inference_steps": 51}, "less than or equal to 50",
     ["body", "num_inference_steps"]),
    ({"prompt": "p", "seed": -1}, "greater than or equal to 0", ["body", "seed"]),
    ({"prompt": "p", "response_format": "png"}, "'raw' or 'jpeg'", ["body", "response_format"]),
    ({"prompt": "p", "width": 30}, "multiple of 8", ["body", "width"]),
    ({"num_inference_steps": 2}, "Field required", ["body", "prompt"]),
    # A model without a ControlNet refuses control inputs.
    ({"prompt": "p", "control_images": [{"image": PNG}]}, "has no ControlNet",
     ["body", "control_images"]),
    ({"prompt": "p", "controlnet_weights": [1.0]}, "has no ControlNet",
     ["body", "control_images"]),
])
def test_generation_422(sd, body, says, loc):
    assert _check(sd, GEN, body, 422, says)["loc"] == loc


@pytest.mark.parametrize("body, says, loc", [
    ({"prompt": "p", "control_images": [{"image": PNG}], "controlnet_weights": [1.5]},
     "less than or equal to 1", ["body", "controlnet_weights", 0]),
    ({"prompt": "p", "control_images": [{"image": PNG}], "controlnet_weights": [-0.1]},
     "greater than or equal to 0", ["body", "controlnet_weights", 0]),
    ({"prompt": "p", "control_images": [{"image": PNG}], "controlnet_weights": [0.5, 0.5]},
     "2 values for 1 control images", ["body", "controlnet_weights"]),
    ({"prompt": "p", "control_images": [{"image": PNG}, {"image": PNG}]},
     "one ControlNet", ["body", "control_images"]),
    ({"prompt": "p", "control_images": [{"image": "bm90IGFuIGltYWdl"}]},
     "could not be decoded", ["body", "control_images", 0]),
])
def test_controlnet_422(cn, body, says, loc):
    assert _check(cn, GEN, body, 422, says)["loc"] == loc


def test_edit_422(sd):
    three = [{"image": PNG}] * 3
    _check(sd, EDIT, {"prompt": "p", "image": three}, 422, "got 3")
    _check(sd, EDIT, {"prompt": "p", "image": []}, 422, "got 0")
    _check(sd, EDIT, {"prompt": "p", "image": {"image": "%%% not base64"}}, 422,
           "must be an http(s) URL, a data URI or base64")
    not_image = "data:image/png;base64," + base64.b64encode(b"hello").decode()
    detail = _check(sd, EDIT, {"prompt": "p", "image": [{"image": PNG}, {"image": not_image}]},
                    422, "could not be decoded")
    assert detail["loc"] == ["body", "image", 1]
    _check(sd, EDIT, {"prompt": "p", "image": {"image": PNG}, "strength": 0}, 422,
           "greater than 0")
    _check(sd, EDIT, {"prompt": "p", "image": {"image": "data:image/png,abc"}}, 422,
           "must be base64")


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:{port}/cat.png", "private, loopback or link-local address (127.0.0.1)"),
    ("http://10.1.2.3/cat.png", "(10.1.2.3)"),
    ("http://169.254.169.254/latest/meta-data", "(169.254.169.254)"),
    ("http://192.168.0.1/x.png", "(192.168.0.1)"),
    ("http://[::1]:{port}/cat.png", "(::1)"),
    ("http://[::ffff:127.0.0.1]:{port}/cat.png", "(::ffff:127.0.0.1)"),
    ("http://localhost:{port}/cat.png", "resolves to a private, loopback"),
    # Allowed at first, redirected to a loopback address: refused after the redirect.
    ("{files}/to-loopback", "(127.0.0.1)"),
    ("ftp://example.com/x.png", "must be an http(s) URL"),
])
def test_url_inputs_never_reach_private_addresses(sd, sd_server, files, url, says):
    url = url.format(port=sd_server.port, files=files)
    detail = _check(sd, EDIT, _edit_with(url), 422, says)
    assert detail["loc"] == ["body", "image"]


def test_url_fetch_limits(sd, files):
    _check(sd, EDIT, _edit_with(files + "/text"), 422, "could not be decoded")
    _check(sd, EDIT, _edit_with(files + "/big"), 422, "larger than 50 MiB")
    _check(sd, EDIT, _edit_with(files + "/slow"), 422, "longer than 2 s")
    _check(sd, EDIT, _edit_with(files + "/missing"), 422, "HTTP 404")


def test_decompression_bomb(sd):
    """A small file of 100 M pixels: refused before its pixels are decoded."""
    out = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(out, format="PNG")
    bomb = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    _check(sd, EDIT, {"prompt": "p", "image": {"image": bomb}}, 422, "decompression bomb")


def test_oversize_inline_image(sd):
    huge = "A" * (50 * 2**20 * 4 // 3 + 8)
    _check(sd, EDIT, {"prompt": "p", "image": {"image": huge}}, 422, "larger than 50 MiB")


def test_wrong_model_and_task(sd):
    res = sd.post("/v1/completions", json={"prompt": "hi"})
    assert res.status_code == 400 and "serves image generation" in res.text
    res = sd.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert res.status_code == 400
    res = sd.post(GEN, json={"prompt": "p", "model": "other"})
    assert res.status_code == 404


def test_still_serving_after_bad_input(sd):
    res = sd.post(GEN, json={"prompt": "p", "num_inference_steps": 2, "seed": 1})
    assert res.status_code == 200 and res.json()["image"]
    assert sd.get("/health").status_code == 200
