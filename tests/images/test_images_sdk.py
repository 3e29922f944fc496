"""The official clients against the image routes over a real socket: `friendli`
0.16.5's `container.image.generate` / `edit`, parsed by its own models, and `openai`'s
`images.generate`, whose request we accept but whose response shape is OpenAI's
(`data[].b64_json`), not the container's (`image`): the openai client then hands back
the container's fields untyped."""

import base64
import io

import openai
import pytest
from friendli import SyncFriendli
from friendli.core.models import SDKError
from PIL import Image

from tests.images.conftest import png_bytes
from tests.server.test_friendli_sdk import NO_RETRIES


@pytest.fixture(scope="module")
def image_client():
    with SyncFriendli(token="not-checked", retry_config=NO_RETRIES, timeout_ms=120_000) as c:
        yield c.container.image


def _decoded(image) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(image)))


def test_friendli_generate(image_client, sd_server):
    res = image_client.generate(prompt="a red fox", num_inference_steps=3, seed=4,
                                server_url=sd_server.url)
    assert type(res).__name__ == "ContainerImageGenerateSuccess"
    assert _decoded(res.image).format == "JPEG"
    raw = image_client.generate(prompt="a red fox", num_inference_steps=3, seed=4,
                                response_format="raw", server_url=sd_server.url)
    assert _decoded(raw.image).format == "PNG"


def test_friendli_edit(image_client, sd_server):
    data = "data:image/png;base64," + base64.b64encode(png_bytes((40, 24))).decode()
    res = image_client.edit(image={"image": data}, prompt="a red fox", num_inference_steps=3,
                            seed=4, response_format="raw", server_url=sd_server.url)
    assert _decoded(res.image).size == (32, 16)  # fitted into the model's 32-pixel side
    masked = image_client.edit(
        image=[{"image": data}, {"image": data}], prompt="a red fox", num_inference_steps=3,
        seed=4, server_url=sd_server.url)
    assert _decoded(masked.image).format == "JPEG"


def test_friendli_error_is_an_sdk_error(image_client, sd_server):
    with pytest.raises(SDKError) as err:
        image_client.generate(prompt="p", num_inference_steps=99, server_url=sd_server.url)
    assert err.value.status_code == 422 and "num_inference_steps" in err.value.body


def test_openai_images_generate(sd_server):
    client = openai.OpenAI(base_url=sd_server.url + "/v1", api_key="ignored", max_retries=0)
    # openai's `response_format` values (url, b64_json) are not the container's (raw,
    # jpeg): leave it out, and pass the container's knobs as extra body fields.
    res = client.images.generate(prompt="a red fox", extra_body={
        "num_inference_steps": 3, "seed": 9, "width": 48, "height": 32})
    assert res.data is None  # OpenAI's shape is not ours...
    image = _decoded(res.model_extra["image"])  # ...the container's fields come through
    assert (image.format, image.size) == ("JPEG", (48, 32))
    assert res.model_extra["seed"] == 9
    with pytest.raises(openai.UnprocessableEntityError):
        client.images.generate(prompt="p", response_format="b64_json")
