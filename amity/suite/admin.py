"""`amity admin ...`: accounts on the Suite's database, from the command line (the spec
has no API for them). Works while the Suite runs."""

import argparse
import json
import logging

from amity.config import StoreConfig, add_action, from_namespace


def _run(args: argparse.Namespace) -> None:
    # Here, not at the top: every `amity` command builds this parser (`amity serve`
    # too), and sqlalchemy with alembic take about 0.4 s to import.
    from amity.suite import accounts
    from amity.suite.store.database import open_database

    logging.getLogger("alembic").setLevel(logging.WARNING)  # stdout/stderr stay the answer
    sessions = open_database(from_namespace(StoreConfig, args))
    with sessions.begin() as session:
        if args.action == "create-team":
            print(accounts.create_team(session, args.name).id)
        elif args.action == "create-user":
            print(accounts.create_user(session, args.name, args.team).id)
        elif args.action == "add-member":
            accounts.add_member(session, args.team, args.user)
        elif args.action == "create-project":
            print(accounts.create_project(session, args.team, args.name).id)
        elif args.action == "create-token":
            print(accounts.create_token(session, args.user))
        elif args.action == "list":
            listing = accounts.listing(session)
            if args.json:
                print(json.dumps(listing, indent=2))
            else:
                for kind, rows in listing.items():
                    for row in rows:
                        extra = {k: v for k, v in row.items() if k not in ("id", "name")}
                        print(kind[:-1], row["id"], row["name"], json.dumps(extra) if extra else "")


def add_admin_parser(commands) -> None:
    admin = commands.add_parser("admin", help="manage the Suite's users, teams, projects, tokens")
    actions = admin.add_subparsers(dest="action", required=True)

    def action(name: str, help: str, *arguments: tuple[str, dict]) -> None:
        add_action(actions, name, help, StoreConfig, _run, *arguments)

    team = ("--team", {"required": True, "help": "team id"})
    action("create-team", "create a team; prints its id", ("name", {}))
    action("create-user", "create a user (in --team, else in a new team of their own); "
           "prints the id", ("name", {}), ("--team", {"default": None, "help": "team id"}))
    action("add-member", "add a user to a team", team, ("--user", {"required": True}))
    action("create-project", "create a project in a team; prints its id", ("name", {}), team)
    action("create-token", "create a token for a user; prints it, the only time it is shown",
           ("--user", {"required": True, "help": "user id"}))
    action("list", "list users, teams and projects with their ids",
           ("--json", {"action": "store_true"}))
