"""The Files API over HTTP: the upload flow, dedupe, verification, the signed URLs and
the limits. (The SDK's own run of the same flow is in test_sdk.py.)"""

import base64
import json
import time
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

from amity.suite.files import local

from tests.suite.conftest import start_in_process
from tests.suite.flows import digest, init, post_form, upload

DATA = b"hello, files\n" * 100


def test_upload_flow_gives_uploaded_file_and_a_download_that_returns_the_bytes(suite):
    c, a = suite.client, suite.admin
    started = init(c, a, DATA, "greeting.txt")
    assert started.status_code == 202
    body = started.json()
    assert body["uploadUrl"] and set(body["aws"]) >= {"key", "policy", "x-amz-signature"}
    info = c.get(f"/beta/file/{body['fileId']}", headers=a.headers).json()
    assert info["status"] == "UPLOADING"
    assert post_form(c, body, DATA).status_code == 204
    assert c.patch(f"/beta/file/{body['fileId']}", headers=a.headers).json() == {}
    info = c.get(f"/beta/file/{body['fileId']}", headers=a.headers).json()
    assert info["status"] == "UPLOADED" and info["size"] == len(DATA)
    assert info["digest"] == digest(DATA) and info["projectId"] == a.project_id
    assert info["creatorId"] == a.user_id and info["expiresAt"] is None
    url = c.get(f"/beta/file/{body['fileId']}/download_url", headers=a.headers).json()
    assert url["s3Uri"].startswith("s3://amity-local/") and url["fileId"] == body["fileId"]
    got = c.get(url["downloadUrl"])
    assert got.status_code == 200 and got.content == DATA


def test_same_bytes_in_the_same_project_are_not_uploaded_twice(suite):
    c, a = suite.client, suite.admin
    file_id = upload(c, a, DATA)
    again = init(c, a, DATA, "other-name.txt")
    assert again.status_code == 200
    assert again.json() == {"fileId": file_id, "uploadUrl": None, "aws": None}
    # The SDK completes a deduplicated file too.
    assert c.patch(f"/beta/file/{file_id}", headers=a.headers).status_code == 200
    other = init(c, suite.other, DATA)  # another team's project: its own file
    assert other.status_code == 202 and other.json()["fileId"] != file_id


def test_bytes_that_do_not_match_the_digest_never_become_uploaded(suite):
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    wrong = bytes(reversed(DATA))  # same size, other bytes
    assert post_form(c, body, wrong).status_code == 204
    done = c.patch(f"/beta/file/{body['fileId']}", headers=a.headers)
    assert done.status_code == 422 and "do not match" in done.text
    assert c.get(f"/beta/file/{body['fileId']}", headers=a.headers).json()["status"] == "FAILED"
    assert c.patch(f"/beta/file/{body['fileId']}", headers=a.headers).status_code == 422
    assert c.get(f"/beta/file/{body['fileId']}/download_url", headers=a.headers).status_code == 409
    # A failed file is not a dedupe target.
    assert init(c, a, DATA).status_code == 202


def test_completing_before_the_bytes_arrive_is_refused_and_changes_nothing(suite):
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    assert c.patch(f"/beta/file/{body['fileId']}", headers=a.headers).status_code == 422
    assert c.get(f"/beta/file/{body['fileId']}", headers=a.headers).json()["status"] == "UPLOADING"


def test_more_bytes_than_declared_are_refused_while_streaming(suite):
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    assert post_form(c, body, DATA + b"x").status_code == 400
    assert c.patch(f"/beta/file/{body['fileId']}", headers=a.headers).status_code == 422


def test_the_size_limit_is_configurable(tmp_path):
    small = start_in_process(tmp_path / "s", max_file_size="1000")
    too_big = init(small.client, small.admin, b"x" * 1001)
    assert too_big.status_code == 422 and too_big.json()["detail"][0]["loc"] == ["body", "size"]
    assert init(small.client, small.admin, b"x" * 1000).status_code == 202


def test_an_uploaded_object_cannot_be_replaced_through_its_form(suite):
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    assert post_form(c, body, DATA).status_code == 204
    assert post_form(c, body, DATA).status_code == 409


def _policy(fields: dict) -> dict:
    return json.loads(base64.urlsafe_b64decode(fields["policy"]))


def test_tampered_upload_forms_are_403(suite):
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    fields = body["aws"]
    terms = _policy(fields)
    bigger = base64.urlsafe_b64encode(json.dumps({**terms, "max_size": 10**9}).encode()).decode()
    for tampered in ({**fields, "policy": bigger}, {**fields, "key": "proj_x/file_y"},
                     {**fields, "x-amz-signature": "0" * 64},
                     {k: v for k, v in fields.items() if k != "x-amz-signature"}):
        assert c.post(body["uploadUrl"], data=tampered, files={"file": DATA}).status_code == 403
    assert c.post(body["uploadUrl"], data=fields).status_code == 422  # no file part
    assert c.post(body["uploadUrl"], content=b"junk").status_code == 422


def test_expired_upload_and_download_urls_are_403(tmp_path, monkeypatch):
    quick = start_in_process(tmp_path / "q", url_ttl_s=60)
    c, a = quick.client, quick.admin
    body = init(c, a, DATA).json()
    file_id = upload(c, a, b"other bytes")
    url = c.get(f"/beta/file/{file_id}/download_url", headers=a.headers).json()["downloadUrl"]
    # The object store's clock moves past the TTL: a slow machine cannot outlive a real one.
    later = time.time() + 61
    monkeypatch.setattr(local, "time", SimpleNamespace(time=lambda: later))
    assert post_form(c, body, DATA).status_code == 403
    assert c.get(url).status_code == 403


def test_tampered_download_urls_are_403(suite):
    c, a = suite.client, suite.admin
    mine = upload(c, a, DATA)
    theirs = upload(c, suite.other, b"secret of the other team")
    url = c.get(f"/beta/file/{mine}/download_url", headers=a.headers).json()["downloadUrl"]
    other_url = c.get(f"/beta/file/{theirs}/download_url",
                      headers=suite.other.headers).json()["downloadUrl"]
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    other_path = urlsplit(other_url).path
    later = str(int(query["expires"]) + 10**6)
    assert c.get(f"{other_path}?expires={query['expires']}&signature={query['signature']}").status_code == 403
    assert c.get(f"{parts.path}?expires={later}&signature={query['signature']}").status_code == 403
    assert c.get(f"{parts.path}?expires={query['expires']}&signature={'f' * 64}").status_code == 403
    assert c.get(parts.path).status_code == 422  # unsigned
    assert c.get(f"{parts.path}?expires=\u00e0&signature=\u00a0").status_code == 403  # not ASCII
    assert c.get(url).content == DATA


def test_file_names_never_reach_the_file_system(suite):
    c, a = suite.client, suite.admin
    for name in ("../../../../etc/passwd", "/etc/passwd", "a/../../b", "..", "C:\\x\\..\\y"):
        data = name.encode() * 3
        file_id = upload(c, a, data, name)
        info = c.get(f"/beta/file/{file_id}", headers=a.headers).json()
        assert info["name"] == name and info["status"] == "UPLOADED"
        url = c.get(f"/beta/file/{file_id}/download_url", headers=a.headers).json()
        assert name not in url["s3Uri"] and name not in url["downloadUrl"]
        assert c.get(url["downloadUrl"]).content == data
    root = suite.client.app.state.objects.root
    stored = [p for p in root.rglob("*") if p.is_file()]
    assert stored and all(p.resolve().is_relative_to(root.resolve()) for p in stored)
    # Keys outside the store's own pattern are refused before any signature check.
    assert c.get("/objects/..%2F..%2Fsuite.db?expires=9999999999&signature=x").status_code in (403, 404)


def test_digests_other_than_sha256_hex_are_422(suite):
    c, a = suite.client, suite.admin
    for bad in ("md5:" + "0" * 32, "sha256:" + "0" * 63, "sha256:xyz", "sha256" + "0" * 64,
                "sha256:" + "0" * 65, "SHA1:" + "a" * 40):
        r = init(c, a, DATA, digest=bad)
        assert r.status_code == 422, bad
        assert r.json()["detail"][0]["loc"] == ["body", "digest"]
    upper = init(c, a, DATA, digest="SHA256:" + digest(DATA)[7:].upper())
    assert upper.status_code == 202  # the algorithm and hex case do not matter


def test_file_ttl_sets_expires_at(tmp_path):
    ttl = start_in_process(tmp_path / "t", file_ttl_s=3600)
    file_id = upload(ttl.client, ttl.admin, DATA)
    info = ttl.client.get(f"/beta/file/{file_id}", headers=ttl.admin.headers).json()
    assert info["expiresAt"] is not None and info["expiresAt"] > info["createdAt"]
