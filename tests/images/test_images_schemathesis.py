"""schemathesis on the image operations of our served OpenAPI document, against the
tiny text-to-image server: generated bodies, valid and not, get no 5xx, only declared
status codes, and bodies that conform. Generated sizes and step counts are clamped so
a call runs a few small steps; generated image strings are refused (422) unless they
happen to decode."""

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode

from tests.server.test_schemathesis import CALL_TIMEOUT, CHECKS

MAX_EXAMPLES = 15
CAPS = {"num_inference_steps": 2, "width": 64, "height": 64}


def _keep_it_fast(body):
    if isinstance(body, dict):
        body.setdefault("num_inference_steps", 2)  # else 20
        for key, cap in CAPS.items():
            if isinstance(body.get(key), int) and not isinstance(body[key], bool):
                body[key] = min(body[key], cap)
    return body


@pytest.fixture(scope="module")
def image_schema(sd_server):
    config = schemathesis.Config.from_dict({"request-timeout": 60})
    return schemathesis.openapi.from_url(f"{sd_server.url}/openapi.json", config=config)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ["/v1/images/generations", "/v1/images/edits"])
def test_image_operations_conform(image_schema, sd_server, path, mode):
    operation = image_schema[path]["POST"]
    seen: dict[int, int] = {}

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                         database=None, suppress_health_check=list(hypothesis.HealthCheck),
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
    def check(case):
        case.body = _keep_it_fast(case.body)
        response = case.call_and_validate(base_url=sd_server.url, checks=CHECKS,
                                          timeout=CALL_TIMEOUT)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1

    check()
    print(f"{path} {mode}: statuses {seen}")
    assert seen and set(seen) <= {200, 404, 422}, seen
