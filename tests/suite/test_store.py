"""The database on both backends: SQLite under the data directory and a real
PostgreSQL server started for the tests. Migrations build exactly the models, upgrade
an old database in place, and the Suite behaves the same on either."""

import json

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select

from amity.suite import accounts
from amity.suite.store import models as m
from amity.suite.store.database import open_engine, upgrade
from tests.suite.conftest import start_in_process
from tests.suite.flows import upload

SAMPLE = json.dumps({"messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'suite.db'}"
    return request.getfixturevalue("fresh_postgres")


def test_migrations_build_exactly_the_models(database_url):
    engine = open_engine(database_url)
    upgrade(engine)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), m.Base.metadata) == []


def test_an_old_database_upgrades_in_place_and_keeps_its_accounts(database_url, tmp_path):
    engine = open_engine(database_url)
    upgrade(engine, "0001")  # as the first release left it: accounts only
    from sqlalchemy.orm import Session
    with Session(engine) as session, session.begin():
        team = accounts.create_team(session, "early")
        user_id = accounts.create_user(session, "early-user", team.id).id
        project_id = accounts.create_project(session, team.id, "p").id
        token = accounts.create_token(session, user_id)
    engine.dispose()
    suite = start_in_process(tmp_path / "data", database_url)  # migrates to the newest
    assert suite.admin.user_id == user_id  # no second bootstrap on a used database
    headers = {"Authorization": f"Bearer {token}"}
    r = suite.client.post("/beta/dataset", headers=headers, json={
        "name": "d", "projectId": project_id, "modality": {"input_modals": ["TEXT"],
                                                           "output_modals": ["TEXT"]}})
    assert r.status_code == 200, r.text


def _count(sessions, table) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(table))


def test_files_datasets_versions_and_cascades_behave_alike(database_url, tmp_path):
    suite = start_in_process(tmp_path / "data", database_url)
    c, a = suite.client, suite.admin
    file_id = upload(c, a, b"\x00binary\xff" * 10, "n\u00e4me with spaces")
    assert c.get(f"/beta/file/{file_id}", headers=a.headers).json()["status"] == "UPLOADED"
    ds = c.post("/beta/dataset", headers=a.headers, json={
        "name": "100%_match", "projectId": a.project_id,
        "modality": {"input_modals": ["TEXT"], "output_modals": ["TEXT"]}}).json()["id"]
    c.post("/beta/dataset", headers=a.headers, json={
        "name": "100 percent", "projectId": a.project_id,
        "modality": {"input_modals": ["TEXT"], "output_modals": ["TEXT"]}})
    found = c.get("/beta/dataset", headers=a.headers,
                  params={"projectId": a.project_id, "nameSearch": "%_"}).json()["data"]
    assert [d["id"] for d in found] == [ds]  # LIKE's wildcards are matched literally
    split = c.post(f"/beta/dataset/{ds}/split", params={"name": "train"}, headers=a.headers).json()["id"]
    assert c.post(f"/beta/dataset/{ds}/split/{split}/sample", json=[SAMPLE] * 3,
                  headers=a.headers).status_code == 200
    c.post(f"/beta/dataset/{ds}/version", params={"comment": "v"}, headers=a.headers)
    assert (_count(suite.sessions, m.Sample), _count(suite.sessions, m.VersionSample)) == (3, 3)
    assert c.delete(f"/beta/dataset/{ds}", headers=a.headers).status_code == 200
    for table in (m.Dataset, m.Split, m.Sample, m.Version, m.VersionSplit, m.VersionSample):
        # The one "100 percent" dataset stays; everything of the deleted one is gone.
        assert _count(suite.sessions, table) == (1 if table is m.Dataset else 0), table
    assert c.get(f"/beta/dataset/{ds}", headers=a.headers).status_code == 404
