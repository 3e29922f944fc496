"""`amity suite` as a process: the first start bootstraps and prints the admin token
once; a restart keeps files, datasets, versions and tokens (and the URL-signing key)."""

import json

import httpx

from tests.suite.conftest import ADMIN_TOKEN, SuiteProcess
from tests.suite.flows import upload

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_restart_keeps_everything(tmp_path):
    first = SuiteProcess(tmp_path / "data").start()
    try:
        assert f"admin token (shown once): {ADMIN_TOKEN}" in first.output
        project = first.admin_list()["projects"][0]["id"]

        class Account:  # what flows.upload needs
            project_id, headers = project, HEADERS

        with httpx.Client(base_url=first.url) as c:
            file_id = upload(c, Account, b"kept across restarts")
            ds = c.post("/beta/dataset", headers=HEADERS, json={
                "name": "kept", "projectId": project,
                "modality": {"input_modals": ["TEXT"], "output_modals": ["TEXT"]}}).json()["id"]
            split = c.post(f"/beta/dataset/{ds}/split", params={"name": "train"},
                           headers=HEADERS).json()["id"]
            sample = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
            c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=[sample], headers=HEADERS)
            version = c.post(f"/beta/dataset/{ds}/version", params={"comment": "v1"},
                             headers=HEADERS).json()["id"]
    finally:
        first.stop()

    second = SuiteProcess(tmp_path / "data").start()
    try:
        assert "admin token" not in second.output  # no second bootstrap
        with httpx.Client(base_url=second.url) as c:
            assert c.get(f"/beta/file/{file_id}", headers=HEADERS).json()["status"] == "UPLOADED"
            url = c.get(f"/beta/file/{file_id}/download_url", headers=HEADERS).json()["downloadUrl"]
            assert c.get(url).content == b"kept across restarts"
            frozen = c.get(f"/beta/dataset/{ds}/split/{split}/sample", params={"versionId": version},
                           headers=HEADERS).json()["data"]
            assert [d for _, d in frozen] == [sample]
            assert c.get(f"/beta/dataset/{ds}/version", headers=HEADERS).json()["versions"][0]["id"] == version
    finally:
        second.stop()
