"""`amity knowledge ...`: knowledge bases of a running Suite, over its HTTP API (the
embedding happens there): `create --name N FILE...` prints the new base's id, `add`,
`list`, `delete`, and `retrieve` for a quick look."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from amity.config import SuiteClientConfig, add_action, from_namespace

if TYPE_CHECKING:
    import httpx


def _client(config: SuiteClientConfig) -> httpx.Client:
    # Here, not at the top: every `amity` command builds this parser (`amity serve` too).
    import httpx

    token = config.token or os.environ.get("FRIENDLI_TOKEN")
    if not token:
        raise ValueError("give --token or set FRIENDLI_TOKEN")
    headers = {"Authorization": f"Bearer {token}"}
    if config.team:
        headers["X-Friendli-Team"] = config.team
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=600.0, pool=10.0)
    return httpx.Client(base_url=config.suite_url.rstrip("/"), headers=headers, timeout=timeout,
                        trust_env=False)


def _answer(response: httpx.Response) -> dict:
    if response.status_code >= 300:
        try:
            detail = "; ".join(d["msg"] for d in response.json()["detail"])
        except (ValueError, KeyError, TypeError):
            detail = response.text
        raise ValueError(f"the Suite answered {response.status_code}: {detail}")
    return response.json()


def _check_files(files: list[str]) -> None:
    for name in files:
        if not Path(name).is_file():
            raise FileNotFoundError(f"no file {name!r}")


def _upload(client: httpx.Client, knowledge_id: str, files: list[str]) -> None:
    for name in files:
        path = Path(name)
        with path.open("rb") as handle:
            _answer(client.post(f"/beta/knowledge/{knowledge_id}/document/upload",
                                files={"file": (path.name, handle)}))


def _run(args: argparse.Namespace) -> None:
    with _client(from_namespace(SuiteClientConfig, args)) as client:
        if args.action == "create":
            _check_files(args.files)
            base = _answer(client.post("/beta/knowledge", json={"name": args.name}))
            try:
                _upload(client, base["id"], args.files)
            except ValueError:
                client.delete(f"/beta/knowledge/{base['id']}")  # no half-made base is left
                raise
            print(base["id"])
        elif args.action == "add":
            _check_files(args.files)
            _upload(client, args.id, args.files)
        elif args.action == "list":
            for base in _answer(client.get("/beta/knowledge"))["data"]:
                print(base["id"], base["name"], f"{base['documentCount']} documents",
                      f"{base['chunkCount']} chunks")
        elif args.action == "delete":
            _answer(client.delete(f"/beta/knowledge/{args.id}"))
        elif args.action == "retrieve":
            body = {"query": args.query, "k": args.k, "knowledgeIds": [args.id]}
            answer = _answer(client.post("/serverless/v1/knowledge/retrieve", json=body))
            print(json.dumps(answer["results"], indent=2, ensure_ascii=False))


def add_knowledge_parser(commands) -> None:
    knowledge = commands.add_parser("knowledge", help="manage a running Suite's knowledge bases")
    actions = knowledge.add_subparsers(dest="action", required=True)

    def action(name: str, help: str, *arguments: tuple[str, dict]) -> None:
        add_action(actions, name, help, SuiteClientConfig, _run, *arguments)

    files = ("files", {"nargs": "+", "metavar": "FILE", "help": ".txt, .md or .pdf files"})
    base = ("id", {"help": "knowledge base id"})
    action("create", "create a knowledge base from files; prints its id",
           ("--name", {"required": True}), files)
    action("add", "add files to a knowledge base", base, files)
    action("list", "list the team's knowledge bases")
    action("delete", "delete a knowledge base", base)
    action("retrieve", "print the chunks that best match a query", base, ("query", {}),
           ("--k", {"type": int, "default": 5}))
