"""A real `amity suite` process started without `--knowledge-embedding-url`, which
starts its own all-MiniLM-L6-v2 replica on the first embedding: `amity knowledge
create --name N FILE...` builds a base from files and prints its id, `list` and
`retrieve` show it, and friendli==0.12.8's `serverless.knowledge.retrieve` (in the
second venv, tests/suite/sdk012/check_knowledge.py) retrieves from it over a real
socket."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.suite.conftest import ADMIN_TOKEN, REPO
from tests.suite.knowledge.corpus import DOCUMENTS
from tests.suite.knowledge.pdf import make_pdf

SDK_PYTHON = REPO / ".venv-sdk012" / "bin" / "python"
CHECKS = Path(__file__).parents[1] / "sdk012" / "check_knowledge.py"


def amity(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amity.cli", "knowledge", *args, "--suite-url", url,
                           "--token", ADMIN_TOKEN], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_cli_builds_a_base_and_the_sdk_retrieves_from_it(knowledge_process, tmp_path):
    paths = []
    for name in ("history.md", "cooking.txt"):
        paths.append(tmp_path / name)
        paths[-1].write_text(DOCUMENTS[name])
    paths.append(tmp_path / "keeper.pdf")
    paths[-1].write_bytes(make_pdf([["The lighthouse keeper's cat is named Marmalade."]]))
    created = amity("create", "--name", "notes", *map(str, paths), url=knowledge_process.url)
    assert created.returncode == 0, created.stderr
    knowledge_id = created.stdout.strip()
    assert knowledge_id.startswith("kb_")

    listed = amity("list", url=knowledge_process.url)
    assert listed.returncode == 0 and f"{knowledge_id} notes 3 documents" in listed.stdout
    found = amity("retrieve", knowledge_id, "What is the cat called?", "--k", "1",
                  url=knowledge_process.url)
    assert "Marmalade" in json.loads(found.stdout)[0]["text"]
    refused = amity("create", "--name", "bad", str(tmp_path / "missing.txt"), url=knowledge_process.url)
    assert refused.returncode != 0 and "missing.txt" in refused.stderr

    if not SDK_PYTHON.exists():
        pytest.skip(f"{SDK_PYTHON} is missing: `make test` builds it (friendli==0.12.8)")
    team = knowledge_process.admin_list()["teams"][0]["id"]
    env = {**os.environ, "SUITE_URL": knowledge_process.url, "SUITE_TOKEN": ADMIN_TOKEN,
           "SUITE_TEAM": team, "KNOWLEDGE_ID": knowledge_id,
           "KNOWLEDGE_QUESTION": "Who was the first emperor of ancient Rome?",
           "KNOWLEDGE_ANSWER": "Augustus"}
    env.pop("PYTHONPATH", None)  # the SDK venv must not see the main venv's packages
    result = subprocess.run(
        [SDK_PYTHON, "-m", "pytest", CHECKS, "-v", "-p", "no:cacheprovider",
         "--confcutdir", CHECKS.parent, "--rootdir", CHECKS.parent],
        capture_output=True, text=True, timeout=600, env=env, cwd=CHECKS.parent)
    print(result.stdout[-5000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-5000:]
    assert "= 3 passed in" in result.stdout
