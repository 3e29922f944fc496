"""The S3 object store against a real S3 API server (moto in server mode): the same
Files flow, with S3's own presigned POST and GET."""

import boto3
import httpx
import pytest

from tests.suite.conftest import start_in_process
from tests.suite.flows import init, post_form, upload

DATA = b"bytes kept in S3 " * 64


@pytest.fixture
def s3_suite(s3_endpoint, tmp_path, monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    bucket = f"amity-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return start_in_process(tmp_path / "data", object_store=f"s3://{bucket}",
                            s3_endpoint_url=s3_endpoint), bucket


def test_upload_verify_and_download_through_s3(s3_suite):
    suite, bucket = s3_suite
    c, a = suite.client, suite.admin
    with httpx.Client() as s3:
        file_id = upload(c, a, DATA, "../not/a/path", poster=s3)
        info = c.get(f"/beta/file/{file_id}", headers=a.headers).json()
        assert info["status"] == "UPLOADED"
        url = c.get(f"/beta/file/{file_id}/download_url", headers=a.headers).json()
        assert url["s3Uri"] == f"s3://{bucket}/{a.project_id}/{file_id}"
        assert s3.get(url["downloadUrl"]).content == DATA
        assert init(c, a, DATA).status_code == 200  # dedupe works the same


def test_s3_bytes_that_do_not_match_fail(s3_suite):
    suite, _ = s3_suite
    c, a = suite.client, suite.admin
    body = init(c, a, DATA).json()
    with httpx.Client() as s3:
        # (moto does not check POST policies, so the bytes land; real S3 would also take
        # these, which fit the policy: the Suite's own check on complete is what counts.)
        assert post_form(s3, body, bytes(reversed(DATA))).status_code < 300
    assert c.patch(f"/beta/file/{body['fileId']}", headers=a.headers).status_code == 422
    assert c.get(f"/beta/file/{body['fileId']}", headers=a.headers).json()["status"] == "FAILED"


def test_a_missing_bucket_is_a_clear_error(s3_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ValueError, match="no-such-bucket"):
        start_in_process(tmp_path / "data", object_store="s3://no-such-bucket",
                         s3_endpoint_url=s3_endpoint)


def test_tools_read_uploads_and_save_outputs_through_s3(s3_suite):
    """file:text reads an uploaded file and the interpreter's outputs are stored, in S3."""
    from amity.suite.auth import Caller
    from amity.suite.tools.files import StoreFiles
    suite, bucket = s3_suite
    c, a = suite.client, suite.admin
    files = StoreFiles(suite.sessions, c.app.state.objects, Caller(a.user_id, a.team_id), None)
    with httpx.Client() as s3:
        file_id = upload(c, a, DATA, "notes.txt", poster=s3)
        assert files.read(file_id, len(DATA)) == ("notes.txt", DATA)
        with pytest.raises(Exception, match="larger"):
            files.read(file_id, len(DATA) - 1)
        saved = files.save("plot.csv", b"x,y\n1,2\n")
        assert saved.name == "plot.csv" and s3.get(saved.url).content == b"x,y\n1,2\n"
