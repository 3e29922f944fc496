"""Tokens, teams and isolation: 401 without a valid token, 403 for a team the caller is
not in, 404 for every other team's resource on every route."""

import json
import os
import subprocess
import sys

from sqlalchemy import select

from amity.suite.accounts import token_sha256
from amity.suite.auth import SDK_UNSET_TEAM
from amity.suite.store.models import Token
from tests.suite.conftest import ADMIN_TOKEN, REPO, start_in_process
from tests.suite.flows import upload

MODALITY = {"input_modals": ["TEXT"], "output_modals": ["TEXT"]}
SAMPLE = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello"}]})


def _world(suite, account):
    """One of everything, owned by `account`."""
    c, h = suite.client, account.headers
    file_id = upload(c, account, b"bytes of " + account.user_id.encode())
    ds = c.post("/beta/dataset", headers=h, json={"name": "d", "projectId": account.project_id,
                                                  "modality": MODALITY}).json()["id"]
    split = c.post(f"/beta/dataset/{ds}/split", params={"name": "train"}, headers=h).json()["id"]
    c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=[SAMPLE], headers=h)
    version = c.post(f"/beta/dataset/{ds}/version", params={"comment": "v1"}, headers=h).json()["id"]
    return {"file": file_id, "ds": ds, "split": split, "version": version,
            "project": account.project_id}


def _routes(w):
    ds, sp, v, f = w["ds"], w["split"], w["version"], w["file"]
    base = f"/beta/dataset/{ds}"
    return [
        ("PATCH", f"/beta/file/{f}", {}), ("GET", f"/beta/file/{f}", {}),
        ("GET", f"/beta/file/{f}/download_url", {}),
        ("POST", "/beta/file", {"json": {"name": "x", "size": 1, "digest": "sha256:" + "0" * 64,
                                         "projectId": w["project"]}}),
        ("POST", "/beta/dataset", {"json": {"name": "x", "projectId": w["project"],
                                            "modality": MODALITY}}),
        ("GET", "/beta/dataset", {"params": {"projectId": w["project"]}}),
        ("GET", base, {}), ("DELETE", base, {}),
        ("POST", f"{base}/version", {"params": {"comment": "c"}}), ("GET", f"{base}/version", {}),
        ("GET", f"{base}/version/{v}", {}), ("DELETE", f"{base}/version/{v}", {}),
        ("POST", f"{base}/split", {"params": {"name": "n"}}),
        ("GET", f"{base}/split", {}), ("GET", f"{base}/split", {"params": {"versionId": v}}),
        ("GET", f"{base}/split/{sp}", {}), ("DELETE", f"{base}/split/{sp}", {}),
        ("POST", f"{base}/split/{sp}/sample", {"json": [SAMPLE]}),
        ("GET", f"{base}/split/{sp}/sample", {}),
        ("PUT", f"{base}/split/{sp}/sample", {"files": {"file": ("s.jsonl", SAMPLE.encode())}}),
        ("POST", f"{base}/split/{sp}/sample/delete", {"json": [1]}),
    ]


def test_every_route_hides_other_teams_resources_as_404(suite):
    theirs = _world(suite, suite.other)
    routes = _routes(theirs)
    assert len(routes) == 21  # all 20 operations, list_splits twice
    for method, path, kwargs in routes:
        r = suite.client.request(method, path, headers=suite.admin.headers, **kwargs)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["detail"][0]["type"] == "not_found"
    # ... and all of it is still there for its owner.
    for method, path, kwargs in routes:
        if method == "GET":
            r = suite.client.request(method, path, headers=suite.other.headers, **kwargs)
            assert r.status_code == 200, (method, path, r.text)


def test_every_route_needs_a_valid_token(suite):
    mine = _world(suite, suite.admin)
    for method, path, kwargs in _routes(mine):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic YTpi"},
                        {"Authorization": f"Bearer {ADMIN_TOKEN}x"}):
            r = suite.client.request(method, path, headers=headers, **kwargs)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"


def test_x_friendli_team_picks_the_team_and_must_be_one_of_the_callers(suite):
    c, a = suite.client, suite.admin
    params = {"projectId": a.project_id}
    assert c.get("/beta/dataset", params=params, headers=a.headers).status_code == 200
    for team in (a.team_id, SDK_UNSET_TEAM, ""):
        r = c.get("/beta/dataset", params=params, headers={**a.headers, "X-Friendli-Team": team})
        assert r.status_code == 200, team
    for team in (suite.other.team_id, "team_nonexistent"):
        r = c.get("/beta/dataset", params=params, headers={**a.headers, "X-Friendli-Team": team})
        assert r.status_code == 403, team
    # A member of two teams sees each team's projects only under that team.
    with suite.sessions.begin() as session:
        from amity.suite.accounts import add_member
        add_member(session, suite.other.team_id, a.user_id)
    other_params = {"projectId": suite.other.project_id}
    assert c.get("/beta/dataset", params=other_params, headers=a.headers).status_code == 404
    assert c.get("/beta/dataset", params=other_params,
                 headers={**a.headers, "X-Friendli-Team": suite.other.team_id}).status_code == 200


def test_tokens_are_stored_only_as_hashes(suite):
    with suite.sessions() as session:
        stored = session.scalars(select(Token)).all()
    assert {t.sha256 for t in stored} == {token_sha256(ADMIN_TOKEN), token_sha256(suite.other.token)}
    db_bytes = b"".join(p.read_bytes() for p in (suite.client.app.state.objects.root.parent).glob("suite.db*"))
    assert ADMIN_TOKEN.encode() not in db_bytes and suite.other.token.encode() not in db_bytes


def _admin(data_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amity.cli", "admin", *args, "--data-dir",
                           str(data_dir)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_admin_commands_create_accounts_that_work(tmp_path, suite):
    data = suite.client.app.state.objects.root.parent
    team = _admin(data, "create-team", "research").stdout.strip()
    user = _admin(data, "create-user", "ada", "--team", team).stdout.strip()
    project = _admin(data, "create-project", "papers", "--team", team).stdout.strip()
    token = _admin(data, "create-token", "--user", user).stdout.strip()
    assert token.startswith("amity_") and len(token) > 40
    listing = json.loads(_admin(data, "list", "--json").stdout)
    assert {"id": project, "name": "papers", "teamId": team} in listing["projects"]
    assert any(u["id"] == user and u["teamIds"] == [team] for u in listing["users"])
    assert token not in json.dumps(listing)
    r = suite.client.post("/beta/dataset", headers={"Authorization": f"Bearer {token}"},
                          json={"name": "d", "projectId": project, "modality": MODALITY})
    assert r.status_code == 200, r.text
    dup = _admin(data, "create-user", "ada")
    assert dup.returncode == 2 and "exists already" in dup.stderr and "Traceback" not in dup.stderr


def _revoke(sessions, token: str) -> None:
    with sessions.begin() as session:
        session.delete(session.scalar(select(Token).where(Token.sha256 == token_sha256(token))))


def test_a_checked_token_is_trusted_for_the_cache_ttl_only(tmp_path):
    """Tokens can change in the database from another process (`amity admin`): the Suite
    trusts a checked one for --auth-cache-ttl-s, and with 0 checks every request."""
    for ttl_s, after_revoke in ((3600.0, 200), (0.0, 401)):
        suite = start_in_process(tmp_path / str(ttl_s), auth_cache_ttl_s=ttl_s)
        try:
            account = suite.account("cached")
            params = {"projectId": account.project_id}
            assert suite.client.get("/beta/dataset", params=params,
                                    headers=account.headers).status_code == 200
            _revoke(suite.sessions, account.token)
            r = suite.client.get("/beta/dataset", params=params, headers=account.headers)
            assert r.status_code == after_revoke, (ttl_s, r.text)
            # a token never checked is looked up, whatever the TTL
            fresh = suite.account("fresh")
            _revoke(suite.sessions, fresh.token)
            assert suite.client.get("/beta/dataset", params={"projectId": fresh.project_id},
                                    headers=fresh.headers).status_code == 401
        finally:
            suite.client.__exit__(None, None, None)
