"""The Files API's upload flow as the SDK performs it (friendli 0.12.8's
`_upload_to_s3`), for tests that drive the API with plain HTTP."""

import hashlib


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def init(client, account, data: bytes, name: str = "a.bin", **overrides):
    body = {"name": name, "size": len(data), "digest": digest(data),
            "projectId": account.project_id, **overrides}
    return client.post("/beta/file", json=body, headers=account.headers)


def post_form(poster, init_body: dict, data: bytes):
    """The presigned POST: the form fields and a `file` part, without the bearer token."""
    return poster.post(init_body["uploadUrl"], data=init_body["aws"], files={"file": data})


def upload(client, account, data: bytes, name: str = "a.bin", poster=None) -> str:
    started = init(client, account, data, name)
    assert started.status_code in (200, 202), started.text
    if started.json()["uploadUrl"] is not None:
        posted = post_form(poster or client, started.json(), data)
        assert posted.status_code < 300, posted.text
    file_id = started.json()["fileId"]
    done = client.patch(f"/beta/file/{file_id}", headers=account.headers)
    assert done.status_code == 200, done.text
    return file_id
