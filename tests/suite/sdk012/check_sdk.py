"""Run by tests/suite/test_sdk.py under .venv-sdk012 (friendli==0.12.8, the release
whose `file` and `dataset` namespaces match the spec), against a real `amity suite`
process over a real socket. Not collected by the main run (the name does not start
with `test_`): the main venv has friendli 0.16.5, which lacks these namespaces.

Environment: SUITE_URL, SUITE_TOKEN, SUITE_PROJECT, SUITE_TEAM.
"""

import base64
import hashlib
import json
import os

import httpx
import pytest
from friendli import SyncFriendli
from friendli.core import models
from friendli.core.utils.retries import RetryConfig
from friendli.models import Sample

URL, TOKEN = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"]
PROJECT, TEAM = os.environ["SUITE_PROJECT"], os.environ["SUITE_TEAM"]
NO_RETRIES = RetryConfig("none", None, False)
# A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                       "hKmMIQAAAABJRU5ErkJggg==")


def conversation(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text},
                                    {"role": "assistant", "content": text.upper()}]},
                      separators=(",", ":"))


@pytest.fixture
def client():
    # No x_friendli_team: the dataset helper then sends the SDK's unset sentinel.
    with SyncFriendli(token=TOKEN, server_url=URL, retry_config=NO_RETRIES,
                      timeout_ms=60_000) as c:
        yield c


def test_file_upload_flow(client):
    data = os.urandom(3000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    init = client.file.init_upload(name="blob.bin", size=len(data), digest=digest,
                                   project_id=PROJECT, x_friendli_team=TEAM)
    assert init.upload_url is not None and init.aws
    httpx.post(init.upload_url, data=init.aws, files={"file": data}, timeout=60).raise_for_status()
    assert client.file.get_info(file_id=init.file_id).status == "UPLOADING"
    client.file.complete_upload(file_id=init.file_id)
    info = client.file.get_info(file_id=init.file_id)
    assert (info.status, info.size, info.digest, info.project_id) == ("UPLOADED", len(data),
                                                                     digest, PROJECT)
    url = client.file.get_download_url(file_id=init.file_id)
    assert url.s3_uri.startswith("s3://") and url.file_id == init.file_id
    assert httpx.get(url.download_url).content == data
    again = client.file.init_upload(name="copy.bin", size=len(data), digest=digest,
                                    project_id=PROJECT)
    assert again.file_id == init.file_id and again.upload_url is None


def test_file_errors_are_sdk_errors(client):
    with pytest.raises(models.HTTPValidationError):
        client.file.init_upload(name="x", size=1, digest="md5:" + "0" * 32, project_id=PROJECT)
    with pytest.raises(models.SDKError) as error:
        client.file.get_info(file_id="file_nonexistent")
    assert error.value.status_code == 404


def test_every_dataset_operation(client):
    ds = client.dataset
    modality = models.DedicatedDatasetModality(input_modals=["TEXT"], output_modals=["TEXT"])
    made = [ds.create_dataset(name=f"sdk-{i}", project_id=PROJECT, modality=modality)
            for i in range(3)]
    info = ds.get_dataset(dataset_id=made[0].id)
    assert info.name == "sdk-0" and info.modality.input_modals == ["TEXT"]

    # Pages of one, the cursor sent back as the SDK does (bytes -> "b'...'").
    seen, cursor = [], None
    while True:
        page = ds.list_datasets(project_id=PROJECT, limit=1, cursor=cursor, name_search="sdk-")
        seen += [d.id for d in page.data]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [d.id for d in made]
    newest = ds.list_datasets(project_id=PROJECT, direction="desc", name_search="sdk-")
    assert [d.id for d in newest.data] == [d.id for d in reversed(made)]

    dataset_id = made[0].id
    train = ds.create_split(dataset_id=dataset_id, name="train")
    test = ds.create_split(dataset_id=dataset_id, name="test")
    assert ds.get_split(dataset_id=dataset_id, split_id=train.id).name == "train"
    assert [s.name for s in ds.list_splits(dataset_id=dataset_id).data] == ["train", "test"]
    with pytest.raises(models.SDKError):
        ds.create_split(dataset_id=dataset_id, name="train")

    added = ds.add_samples(dataset_id=dataset_id, split_id=train.id,
                           request_body=[conversation(f"q{i}") for i in range(5)])
    assert [data for _, data in added.samples] == [conversation(f"q{i}") for i in range(5)]
    full_ids = [full for full, _ in added.samples]
    assert all(f.split(":")[0] == dataset_id and f.split(":")[2] == train.id for f in full_ids)

    listed, cursor = [], None
    while True:
        page = ds.list_samples(dataset_id=dataset_id, split_id=train.id, limit=2, cursor=cursor)
        listed += [tuple(pair) for pair in page.data]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert listed == [tuple(pair) for pair in added.samples]

    version = ds.create_version(dataset_id=dataset_id, comment="five samples")
    assert ds.get_version(dataset_id=dataset_id, version_id=version.id).comment == "five samples"
    assert [v.id for v in ds.list_versions(dataset_id=dataset_id).versions] == [version.id]

    # delete_samples takes bare and full ids.
    bare = full_ids[0].split(":")[3]
    gone = ds.delete_samples(dataset_id=dataset_id, split_id=train.id,
                             request_body=[bare, full_ids[1], int(full_ids[2].split(":")[3])])
    assert gone.sample_ids == full_ids[:3]
    left = ds.list_samples(dataset_id=dataset_id, split_id=train.id)
    assert [full for full, _ in left.data] == full_ids[3:]

    # upload_raw_samples replaces the split's samples with the file's rows.
    rows = "\n".join([conversation("raw-a"), json.dumps({"instruction": "Add", "input": "1+1",
                                                         "output": "2"})]) + "\n"
    replaced = ds.update_samples(dataset_id=dataset_id, split_id=test.id,
                                 file={"file_name": "rows.jsonl", "content": rows.encode()})
    assert len(replaced.samples) == 2
    assert json.loads(replaced.samples[1][1])["messages"][1] == {"role": "assistant",
                                                                 "content": "2"}

    # The version is a snapshot: later changes do not show through it.
    frozen = ds.list_samples(dataset_id=dataset_id, split_id=train.id, version_id=version.id)
    assert [data for _, data in frozen.data] == [conversation(f"q{i}") for i in range(5)]
    assert all(full.split(":")[1] == version.id for full, _ in frozen.data)
    frozen_splits = ds.list_splits(dataset_id=dataset_id, version_id=version.id)
    assert [s.id for s in frozen_splits.data] == [train.id, test.id]
    assert ds.list_samples(dataset_id=dataset_id, split_id=test.id, version_id=version.id).data == []

    ds.delete_split(dataset_id=dataset_id, split_id=test.id)
    assert [s.name for s in ds.list_splits(dataset_id=dataset_id).data] == ["train"]
    ds.delete_version(dataset_id=dataset_id, version_id=version.id)
    assert ds.list_versions(dataset_id=dataset_id).versions == []
    for d in made:
        ds.delete_dataset(dataset_id=d.id)
    with pytest.raises(models.SDKError) as error:
        ds.get_dataset(dataset_id=dataset_id)
    assert error.value.status_code == 404


def test_high_level_upload_of_samples_with_an_image_goes_through_files(client):
    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    samples = [Sample.model_validate({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image", "image": image}]},
        {"role": "assistant", "content": "A pixel."}]})]
    with client.dataset.create(modality=["TEXT", "IMAGE"], name="with-image",
                               project_id=PROJECT) as dataset:
        pairs = dataset.upload_samples(samples=samples)
        assert len(pairs) == 1
        stored = json.loads(pairs[0][1])
        uri = stored["messages"][0]["content"][1]["image"]
        assert uri.startswith("s3://")
        dataset_id = dataset._dataset.id
    listed = client.dataset.list_samples(dataset_id=dataset_id,
                                         split_id=client.dataset._default_split.id)
    assert [tuple(p) for p in listed.data] == [tuple(p) for p in pairs]
    # The image is an uploaded file of the project: its digest is the PNG's.
    init = client.file.init_upload(name="again.png", size=len(PNG), project_id=PROJECT,
                                   digest="sha256:" + hashlib.sha256(PNG).hexdigest())
    assert init.upload_url is None
    url = client.file.get_download_url(file_id=init.file_id)
    assert url.s3_uri == uri and httpx.get(url.download_url).content == PNG


def test_server_side_modality_check(client):
    modality = models.DedicatedDatasetModality(input_modals=["TEXT"], output_modals=["TEXT"])
    d = client.dataset.create_dataset(name="text-only", project_id=PROJECT, modality=modality)
    split = client.dataset.create_split(dataset_id=d.id, name="train")
    image_sample = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image", "image": "https://example.com/cat.png"}]}]})
    with pytest.raises(models.HTTPValidationError):
        client.dataset.add_samples(dataset_id=d.id, split_id=split.id, request_body=[image_sample])
