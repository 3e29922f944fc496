"""Dedicated endpoints of the models that are not chat models, through a real `amity
suite` process and real replicas: a tiny random-weight diffusers pipeline (images), a
tiny encoder and a tiny classifier (embeddings, classify) and Whisper tiny.en
(transcription, multipart), placed in the model registry by the fixtures. friendli
0.12.8 drives the operations it has (sdk012/check_media.py); httpx the multipart edge
cases and the endpoint queue's 429."""

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from amity.models.packaged_whisper import packaged_whisper_dir
from tests.audio.conftest import speech_bytes, speech_dir  # noqa: F401 (a fixture)
from tests.images.tiny_pipeline import build_text_to_image
from tests.models.conftest import pooling_checkpoint, wordpiece_dir  # noqa: F401 (fixtures)
from tests.suite.conftest import ADMIN_TOKEN
from tests.suite.endpoint_fixtures import create_body, start_suite, wait_status
from tests.suite.test_sdk import SDK_PYTHON

pytestmark = pytest.mark.slow
BASE = "/dedicated/beta/endpoint"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REPOS = {"sd": "acme/tiny-sd", "embed": "acme/tiny-encoder", "classify": "acme/tiny-classifier",
         "whisper": "openai/whisper-tiny.en"}
CHECKS = Path(__file__).parent / "sdk012" / "check_media.py"


@pytest.fixture(scope="module")
def registry(tmp_path_factory, pooling_checkpoint):  # noqa: F811
    root = tmp_path_factory.mktemp("media-registry")
    build_text_to_image(root / REPOS["sd"])
    shutil.copytree(pooling_checkpoint("bert", head=False), root / REPOS["embed"])
    shutil.copytree(pooling_checkpoint("bert", head=True), root / REPOS["classify"])
    (root / REPOS["whisper"]).parent.mkdir()
    (root / REPOS["whisper"]).symlink_to(packaged_whisper_dir("whisper-tiny.en"))
    return root


@pytest.fixture(scope="module")
def suite(tmp_path_factory, registry):
    process = start_suite(tmp_path_factory.mktemp("media") / "data", registry)
    project = process.admin_list()["projects"][0]["id"]
    process.http = httpx.Client(base_url=process.url, headers=HEADERS, timeout=300, trust_env=False)
    # One replica each; the Whisper one takes one request at a time (the 429 test).
    advanced = {"whisper": {**create_body("")["advanced"], "max_batch_size": 1}}
    process.endpoints = {}
    for kind, repo in REPOS.items():
        body = create_body(project, repo, name=kind, simplescale={"replicas": 1},
                           **({"advanced": advanced[kind]} if kind in advanced else {}))
        r = process.http.post(BASE, json=body)
        assert r.status_code == 200, r.text
        process.endpoints[kind] = r.json()["id"]
    for kind, endpoint in process.endpoints.items():
        status = wait_status(process.http, endpoint, {"RUNNING", "FAILED"}, timeout_s=900)
        assert status["status"] == "RUNNING", (kind, status)
    yield process
    process.http.close()
    process.stop(timeout_s=120)  # four replicas stop with it


def multipart(fields: dict, audio: bytes) -> tuple[bytes, str]:
    """(body, Content-Type) of a form with `fields` in order, then the file."""
    request = httpx.Request("POST", "http://x", data=fields, files={"file": ("park.wav", audio, "audio/wav")})
    return request.read(), request.headers["content-type"]


def transcribe(suite, body: bytes, content_type: str, **headers) -> httpx.Response:
    return suite.http.post("/dedicated/v1/audio/transcriptions", content=body,
                           headers={"content-type": content_type, **headers})


def test_friendli_0_12_8_drives_media_operations(suite, speech_dir):  # noqa: F811
    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    env = {**os.environ, "SUITE_URL": suite.url, "SUITE_TOKEN": ADMIN_TOKEN,
           "SPEECH_WAV": str(speech_dir / "park.wav"),
           **{f"{kind.upper()}_ENDPOINT": endpoint for kind, endpoint in suite.endpoints.items()}}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
         "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
        capture_output=True, text=True, timeout=900, env=env, cwd=CHECKS.parent)
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:]
    assert "= 3 passed in" in result.stdout


def test_images_reshaped_and_refused(suite):
    sd = suite.endpoints["sd"]
    body = {"model": sd, "prompt": "a cat", "num_inference_steps": 2, "seed": 11}
    r = suite.http.post("/dedicated/v1/images/generations", json={**body, "response_format": "raw"})
    assert r.status_code == 200, r.text
    assert r.json()["data"][0].keys() == {"seed", "response_format", "b64_json"}
    # the replica's own 422s come back as they are (a format outside the spec, a bad step count)
    for bad in ({"response_format": "gif"}, {"num_inference_steps": 0}):
        r = suite.http.post("/dedicated/v1/images/generations", json={**body, **bad})
        assert r.status_code == 422 and "detail" in r.json(), r.text
    r = suite.http.post("/dedicated/v1/images/edits", json={**body, "image": {"image": "not an image"}})
    assert r.status_code == 422, r.text
    r = suite.http.post("/dedicated/v1/chat/completions", json={"model": sd, "messages": []})
    assert r.status_code // 100 == 4, r.text


def test_transcription_multipart(suite, speech_dir):  # noqa: F811
    whisper, audio = suite.endpoints["whisper"], speech_bytes(speech_dir, "park")
    plain = transcribe(suite, *multipart({"model": whisper}, audio))
    assert plain.status_code == 200 and "children" in plain.json()["text"], plain.text
    # `model` after the file is found as well
    request = httpx.Request("POST", "http://x", files=[("file", ("park.wav", audio, "audio/wav")),
                                                        ("model", (None, whisper))])
    r = transcribe(suite, request.read(), request.headers["content-type"])
    assert r.status_code == 200 and r.json()["text"] == plain.json()["text"], r.text
    # no `stream` field, Accept preferring SSE: a stream (platform-notes §0.3)
    r = transcribe(suite, *multipart({"model": whisper}, audio), accept="text/event-stream")
    assert r.headers["content-type"].startswith("text/event-stream"), r.text
    frames = [f.removeprefix("data: ") for f in r.text.split("\n\n") if f.strip()]
    assert frames[-1] == "[DONE]" and json.loads(frames[-2])["text"] == plain.json()["text"]
    r = transcribe(suite, *multipart({"model": whisper, "stream": "false"}, audio),
                   accept="text/event-stream")
    assert r.json()["text"] == plain.json()["text"]
    # the router's refusals
    r = transcribe(suite, *multipart({"language": "en"}, audio))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"], r.text
    assert transcribe(suite, *multipart({"model": "ep_nope"}, audio)).status_code == 404
    assert transcribe(suite, b"--x\r\nbroken", "multipart/form-data").status_code == 422
    r = transcribe(suite, audio, "audio/wav")
    assert r.status_code == 415 and r.json()["detail"][0]["type"] == "unsupported_media_type"
    # the replica's own refusal: a text route on a Whisper model
    r = suite.http.post("/dedicated/v1/completions", json={"model": whisper, "prompt": "x"})
    assert r.status_code == 400, r.text


def test_full_queue_answers_429(suite, speech_dir):  # noqa: F811
    """The Whisper endpoint takes one request at a time (max_batch_size 1). An upload
    that stops after its `model` field holds that slot for as long as the test wants;
    meanwhile a second request waits in the queue and gets the 429. Should the second
    request win the slot instead (the held one is then refused or served after it),
    the round is run again: nothing here depends on how long anything takes."""
    whisper, audio = suite.endpoints["whisper"], speech_bytes(speech_dir, "park")
    body, content_type = multipart({"model": whisper}, audio)
    cut = body.index(b"RIFF")  # the file's first bytes: `model` is complete before them

    def held_round():
        head_sent, go_on, answers = threading.Event(), threading.Event(), []

        def upload():
            yield body[:cut]
            head_sent.set()  # asked for more: the head is on the wire
            go_on.wait()
            yield body[cut:]

        def send():
            with httpx.Client(base_url=suite.url, headers=HEADERS, timeout=300, trust_env=False) as c:
                try:
                    answers.append(c.post("/dedicated/v1/audio/transcriptions", content=upload(),
                                          headers={"content-type": content_type}))
                except httpx.HTTPError as error:  # refused before its upload ended
                    answers.append(error)

        holder = threading.Thread(target=send)
        holder.start()
        head_sent.wait()
        try:
            second = transcribe(suite, body, content_type)
        finally:
            go_on.set()
            holder.join(timeout=300)
        return second, answers[0]

    for _ in range(10):
        second, held = held_round()
        if second.status_code == 429:
            break
        assert second.status_code == 200, second.text
    assert second.status_code == 429, second.text
    [error] = second.json()["detail"]
    assert (error["loc"], error["type"]) == (["body", "model"], "queue_timeout")
    assert "no replica slot came free" in error["msg"]
    assert held.status_code == 200 and "children" in held.json()["text"], held
    assert transcribe(suite, body, content_type).status_code == 200  # the slot came back
