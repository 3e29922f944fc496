"""Datasets over HTTP: cursors, snapshots, sample ids, raw uploads, modality and media
checks. (The SDK's run of all 16 operations is in test_sdk.py.)"""

import base64
import json

import pytest

from tests.suite.flows import upload

TEXT = {"input_modals": ["TEXT"], "output_modals": ["TEXT"]}


def sample(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}]})


def _dataset(suite, modality=TEXT):
    c, h = suite.client, suite.admin.headers
    ds = c.post("/beta/dataset", headers=h, json={"name": "d", "projectId": suite.admin.project_id,
                                                  "modality": modality}).json()["id"]
    split = c.post(f"/beta/dataset/{ds}/split", params={"name": "train"}, headers=h).json()["id"]
    return ds, split


def test_cursors_page_through_in_both_directions_and_decode_wrapped(suite):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    texts = [sample(f"s{i}") for i in range(7)]
    c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=texts, headers=h)
    url = f"/beta/dataset/{ds}/split/{split}/sample"
    for direction, expected in (("asc", texts), ("desc", texts[::-1])):
        got, cursor, wrap = [], None, False
        while True:
            params = {"limit": 3, "direction": direction}
            if cursor:  # alternately as given and as the SDK sends it back
                params["cursor"] = f"b'{cursor}'" if wrap else cursor
                wrap = not wrap
            page = c.get(url, params=params, headers=h).json()
            got += [data for _, data in page["data"]]
            if page["nextCursor"] is None:
                break
            cursor = page["nextCursor"]
        assert got == expected
    for bad in ("x", "b'", "b'x'", base64.urlsafe_b64encode(b'{"after": "1"}').decode(),
                base64.urlsafe_b64encode(b"[1]").decode(), "%00"):
        r = c.get(url, params={"cursor": bad}, headers=h)
        assert r.status_code == 422, bad
    assert c.get(url, params={"limit": 0}, headers=h).status_code == 422
    assert c.get(url, params={"limit": 101}, headers=h).status_code == 422


def test_a_version_never_changes(suite):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=[sample("a"), sample("b")], headers=h)
    v = c.post(f"/beta/dataset/{ds}/version", params={"comment": "two"}, headers=h).json()["id"]
    ids = [f for f, _ in c.get(f"/beta/dataset/{ds}/split/{split}/sample", headers=h).json()["data"]]
    c.post(f"/beta/dataset/{ds}/split/{split}/sample/delete", json=[ids[0]], headers=h)
    c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=[sample("c")], headers=h)
    c.post(f"/beta/dataset/{ds}/split", params={"name": "later"}, headers=h)
    frozen = c.get(f"/beta/dataset/{ds}/split/{split}/sample", params={"versionId": v},
                   headers=h).json()["data"]
    assert [d for _, d in frozen] == [sample("a"), sample("b")]
    assert [s["name"] for s in c.get(f"/beta/dataset/{ds}/split", params={"versionId": v},
                                     headers=h).json()["data"]] == ["train"]
    c.delete(f"/beta/dataset/{ds}/split/{split}", headers=h)
    again = c.get(f"/beta/dataset/{ds}/split/{split}/sample", params={"versionId": v}, headers=h)
    assert [d for _, d in again.json()["data"]] == [sample("a"), sample("b")]
    # A version's samples cannot be deleted through their full ids.
    split2 = c.post(f"/beta/dataset/{ds}/split", params={"name": "x"}, headers=h).json()["id"]
    r = c.post(f"/beta/dataset/{ds}/split/{split2}/sample/delete",
               json=[frozen[0][0].replace(split, split2)], headers=h)
    assert r.status_code == 422
    # Deleting the version leaves the working copy alone.
    c.delete(f"/beta/dataset/{ds}/version/{v}", headers=h)
    assert c.get(f"/beta/dataset/{ds}/version/{v}", headers=h).status_code == 404
    assert c.get(f"/beta/dataset/{ds}/split/{split2}", headers=h).status_code == 200


def test_delete_samples_checks_every_id_before_deleting_any(suite):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    ids = [f for f, _ in c.post(f"/beta/dataset/{ds}/split/{split}/sample",
                                json=[sample("a"), sample("b")], headers=h).json()["samples"]]
    url = f"/beta/dataset/{ds}/split/{split}/sample/delete"
    assert c.post(url, json=[ids[0], 999999], headers=h).status_code == 404
    for bad in (["abc"], [-1], [True], [2**40], ["ds_x:latest:split_y:1"], [1.5], [None]):
        assert c.post(url, json=bad, headers=h).status_code == 422, bad
    listed = c.get(f"/beta/dataset/{ds}/split/{split}/sample", headers=h).json()["data"]
    assert [f for f, _ in listed] == ids
    assert c.post(url, json=[ids[0].split(":")[3], ids[1]], headers=h).json()["sampleIds"] == ids


def test_bad_samples_and_modalities_are_422(suite):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    url = f"/beta/dataset/{ds}/split/{split}/sample"
    image = {"type": "image", "image": "https://example.com/x.png"}
    for bad in ("not json", "[]", json.dumps({"messages": "x"}),
                json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
                json.dumps({"messages": [{"role": "user", "content": [{"type": "smell"}]}]}),
                json.dumps({"messages": [{"role": "user", "content": [image]}]}),
                json.dumps({"messages": [{"role": "system", "content": [image]}]}), "a\x00b"):
        r = c.post(url, json=[sample("fine"), bad], headers=h)
        assert r.status_code == 422, bad
        assert r.json()["detail"][0]["loc"][-1] == 1, r.text  # names the bad sample
    assert c.get(url, headers=h).json()["data"] == []  # nothing of a refused call is kept
    both, split2 = _dataset(suite, {"input_modals": ["TEXT", "IMAGE"], "output_modals": ["TEXT"]})
    ok = json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, image]}]})
    assert c.post(f"/beta/dataset/{both}/split/{split2}/sample", json=[ok], headers=h).status_code == 200


def test_media_in_our_bucket_must_be_an_uploaded_file_of_the_team(suite):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite, {"input_modals": ["TEXT", "IMAGE"], "output_modals": ["TEXT"]})
    mine = upload(c, suite.admin, b"png bytes")
    theirs = upload(c, suite.other, b"their png bytes")
    uri = c.get(f"/beta/file/{mine}/download_url", headers=h).json()["s3Uri"]
    their_uri = c.get(f"/beta/file/{theirs}/download_url", headers=suite.other.headers).json()["s3Uri"]

    def with_image(u):
        return json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "image": u}]}]})

    url = f"/beta/dataset/{ds}/split/{split}/sample"
    assert c.post(url, json=[with_image(uri)], headers=h).status_code == 200
    assert c.post(url, json=[with_image(their_uri)], headers=h).status_code == 422
    assert c.post(url, json=[with_image("s3://amity-local/proj_x/file_y")], headers=h).status_code == 422
    assert c.post(url, json=[with_image("s3://elsewhere/k.png")], headers=h).status_code == 200


@pytest.mark.parametrize("name,content,status", [
    ("rows.jsonl", b'{"messages":[]}\n\n{"instruction":"i","output":"o"}\n', 200),
    ("rows.jsonl", b'{"messages":[]}\nnot json\n', 422),
    ("rows.jsonl", b'{"prompt":"x"}\n', 422),
    ("rows.csv", b"a,b\n", 422),
    ("rows.jsonl", b"\xff\xfe\n", 422),
])
def test_upload_raw_samples_replaces_the_split(suite, name, content, status):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    url = f"/beta/dataset/{ds}/split/{split}/sample"
    c.post(url, json=[sample("old")], headers=h)
    r = c.put(url, files={"file": (name, content)}, headers=h)
    assert r.status_code == status, r.text
    data = [d for _, d in c.get(url, headers=h).json()["data"]]
    if status == 200:
        assert len(data) == 2 and json.loads(data[1])["messages"][0] == {"role": "user", "content": "i"}
    else:
        assert data == [sample("old")]  # a refused file changes nothing


def test_split_names_are_unique_per_dataset(suite):
    c, h = suite.client, suite.admin.headers
    ds, _ = _dataset(suite)
    assert c.post(f"/beta/dataset/{ds}/split", params={"name": "train"}, headers=h).status_code == 409
    other, _ = _dataset(suite)
    assert c.post(f"/beta/dataset/{other}/split", params={"name": "eval"}, headers=h).status_code == 200


def _parquet(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


@pytest.mark.parametrize("content,status,count", [
    (_parquet([{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
               {"messages": [{"role": "user", "content": "c"}]}]), 200, 2),
    (_parquet([{"instruction": "i", "input": None, "output": "o"}]), 200, 1),
    (_parquet([{"prompt": "x"}]), 422, 0),
    (b"PAR1 not really parquet", 422, 0),
])
def test_upload_raw_samples_takes_parquet(suite, content, status, count):
    c, h = suite.client, suite.admin.headers
    ds, split = _dataset(suite)
    url = f"/beta/dataset/{ds}/split/{split}/sample"
    c.post(url, json=[sample("old")], headers=h)
    r = c.put(url, files={"file": ("rows.parquet", content)}, headers=h)
    assert r.status_code == status, r.text
    data = [json.loads(d) for _, d in c.get(url, headers=h).json()["data"]]
    if status == 200:
        assert len(data) == count and len(r.json()["samples"]) == count
        assert data[0]["messages"][0]["role"] == "user"
        assert data[0]["messages"][0]["content"] in ("a", "i")
    else:
        assert data == [json.loads(sample("old"))]
