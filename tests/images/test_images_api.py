"""Image generation and edits over real HTTP on tiny random-weight pipelines: seeds,
batching, formats, sizes, image-to-image, inpainting, ControlNet, metrics."""

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from tests.images.conftest import png_bytes

GEN = "/v1/images/generations"
EDIT = "/v1/images/edits"


def _post(client, path, **body) -> dict:
    res = client.post(path, json={"prompt": "a red fox", "num_inference_steps": 3, **body})
    assert res.status_code == 200, res.text
    return res.json()


def _image(answer: dict) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(answer["image"])))


def _b64(data: bytes) -> dict:
    return {"image": "data:image/png;base64," + base64.b64encode(data).decode()}


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_same_seed_same_bytes_different_seeds_differ(sd):
    a, b = _post(sd, GEN, seed=7), _post(sd, GEN, seed=7)
    c = _post(sd, GEN, seed=8)
    assert a["image"] == b["image"] and a["seed"] == 7
    assert c["image"] != a["image"]


def test_seed_is_drawn_and_reported(sd):
    drawn = _post(sd, GEN, response_format="raw")
    assert isinstance(drawn["seed"], int)
    again = _post(sd, GEN, response_format="raw", seed=drawn["seed"])
    assert again["image"] == drawn["image"]


def test_jpeg_is_a_jpeg_of_the_requested_size_and_raw_a_png(sd):
    jpeg = _image(_post(sd, GEN, seed=1, width=48, height=24))
    assert (jpeg.format, jpeg.size) == ("JPEG", (48, 24))
    raw = _image(_post(sd, GEN, seed=1, width=48, height=24, response_format="raw"))
    assert (raw.format, raw.size, raw.mode) == ("PNG", (48, 24), "RGB")
    default = _image(_post(sd, GEN, seed=1))
    assert (default.format, default.size) == ("JPEG", (32, 32))  # the model's own size


@pytest.mark.slow
def test_batched_equals_solo(sd):
    """Four requests sent together run as one batch (the server's batch wait is long)
    and each image is the same bytes as when it ran alone. With guidance > 1 the batch
    runs classifier-free guidance (twice the rows)."""
    bodies = [dict(seed=s, prompt=p, guidance_scale=g, response_format="raw")
              for s, p, g in ((11, "a red fox", 7.5), (12, "a blue whale", 7.5),
                              (13, "x", 7.5), (14, "a red fox", 7.5))]
    solo = [_post(sd, GEN, **b)["image"] for b in bodies]
    batches = _metric(sd, "amity_image_batches_total")
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: _post(sd, GEN, **b)["image"], bodies))
    assert _metric(sd, "amity_image_batches_total") - batches < len(bodies)  # batched
    assert together == solo
    assert len(set(solo)) == len(solo)


def test_edit_image_to_image(sd, files):
    source = png_bytes((40, 24))
    a = _post(sd, EDIT, image=_b64(source), seed=3, response_format="raw")
    b = _post(sd, EDIT, image=[_b64(source)], seed=3, response_format="raw")
    assert a["image"] == b["image"]
    # The input's size, fitted into the model's 32-pixel side: 32 x 19, then to 8s.
    assert _image(a).size == (32, 16)
    small = _post(sd, EDIT, image=_b64(png_bytes((24, 16))), seed=3, response_format="raw")
    assert _image(small).size == (24, 16)  # a smaller input keeps its size
    other = _post(sd, EDIT, image=_b64(png_bytes((40, 24), (0, 90, 200))), seed=3,
                  response_format="raw")
    assert other["image"] != a["image"]  # the input image matters
    # The same image by URL (the allow-listed address) gives the same bytes.
    by_url = _post(sd, EDIT, image={"image": files + "/cat.png"}, seed=3, response_format="raw")
    assert by_url["image"] == a["image"]
    via_redirect = _post(sd, EDIT, image={"image": files + "/to-cat"}, seed=3,
                         response_format="raw")
    assert via_redirect["image"] == a["image"]


def test_edit_inpainting_with_a_mask(sd, inpaint):
    image, white, black = png_bytes(), png_bytes(color=(255, 255, 255)), png_bytes(color=(0, 0, 0))
    for client in (sd, inpaint):  # a text-to-image model's derived pipeline, an inpainting model
        painted = _post(client, EDIT, image=[_b64(image), _b64(white)], seed=5,
                        response_format="raw", width=32, height=32)
        again = _post(client, EDIT, image=[_b64(image), _b64(white)], seed=5,
                      response_format="raw", width=32, height=32)
        kept = _post(client, EDIT, image=[_b64(image), _b64(black)], seed=5,
                     response_format="raw", width=32, height=32)
        assert painted["image"] == again["image"] != kept["image"]
        assert _image(painted).size == (32, 32)


def test_inpainting_model_serves_edits_with_a_mask_only(inpaint):
    res = inpaint.post(GEN, json={"prompt": "a fox"})
    assert res.status_code == 400 and "/v1/images/edits" in res.text
    res = inpaint.post(EDIT, json={"prompt": "a fox", "image": _b64(png_bytes())})
    assert res.status_code == 422 and "mask" in res.text


def test_controlnet(cn):
    control = _b64(png_bytes(color=(255, 255, 255)))
    full = _post(cn, GEN, control_images=[control], seed=2, response_format="raw")
    same = _post(cn, GEN, control_images=[control], controlnet_weights=[1.0], seed=2,
                 response_format="raw")
    off = _post(cn, GEN, control_images=[control], controlnet_weights=[0.0], seed=2,
                response_format="raw")
    other = _post(cn, GEN, control_images=[_b64(png_bytes(color=(0, 0, 0)))], seed=2,
                  response_format="raw")
    assert full["image"] == same["image"]  # 1.0 is the default weight
    assert off["image"] != full["image"] and other["image"] != full["image"]
    # Edits on a ControlNet model run without it.
    assert _image(_post(cn, EDIT, image=control, seed=2)).size == (32, 32)


def test_metrics(sd):
    before = _metric(sd, "amity_images_generated_total")
    steps = _metric(sd, "amity_image_steps_total")
    _post(sd, GEN, seed=1, num_inference_steps=4)
    assert _metric(sd, "amity_images_generated_total") == before + 1
    assert _metric(sd, "amity_image_steps_total") == steps + 4
    assert _metric(sd, "amity_image_steps_per_second") > 0
    assert _metric(sd, "friendli_requests_queueing_delays_count") > 0
