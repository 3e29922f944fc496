"""Users, teams, projects and tokens: what `amity admin` and the first start create.

A token is `amity_` + 32 random bytes (URL-safe base64); only its sha256 is stored.
sha256 (not a slow password hash) is enough for a secret with 256 bits of entropy:
nobody can guess one to match a stolen hash.
"""

import hashlib
import os
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from amity.suite.store.models import Membership, Project, Team, Token, User, new_id, now_s

ADMIN_TOKEN_ENV = "AMITY_ADMIN_TOKEN"
TOKEN_PREFIX = "amity_"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_team(session: Session, name: str) -> Team:
    team = Team(id=new_id("team"), name=name, created_at=now_s())
    session.add(team)
    session.flush()
    return team


def create_project(session: Session, team_id: str, name: str) -> Project:
    if session.get(Team, team_id) is None:
        raise ValueError(f"no team {team_id!r}")
    project = Project(id=new_id("proj"), team_id=team_id, name=name, created_at=now_s())
    session.add(project)
    session.flush()
    return project


def add_member(session: Session, team_id: str, user_id: str) -> None:
    if session.get(Team, team_id) is None:
        raise ValueError(f"no team {team_id!r}")
    if session.get(User, user_id) is None:
        raise ValueError(f"no user {user_id!r}")
    if session.get(Membership, (user_id, team_id)) is None:
        session.add(Membership(user_id=user_id, team_id=team_id))
        session.flush()


def create_user(session: Session, name: str, team_id: str | None = None) -> User:
    """A user who belongs to `team_id` (their default team), or to a new team of their own."""
    if session.scalar(select(User).where(User.name == name)) is not None:
        raise ValueError(f"a user named {name!r} exists already")
    team_id = team_id or create_team(session, f"{name}'s team").id
    if session.get(Team, team_id) is None:
        raise ValueError(f"no team {team_id!r}")
    user = User(id=new_id("user"), name=name, default_team_id=team_id, created_at=now_s())
    session.add(user)
    session.flush()
    add_member(session, team_id, user.id)
    return user


def create_token(session: Session, user_id: str, token: str | None = None) -> str:
    """Store a new token for `user_id` and return it: the only time it is seen."""
    if session.get(User, user_id) is None:
        raise ValueError(f"no user {user_id!r}")
    token = token or TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(Token(id=new_id("tok"), user_id=user_id, sha256=token_sha256(token),
                      created_at=now_s()))
    session.flush()
    return token


@dataclass
class Bootstrap:
    user: User
    team: Team
    project: Project
    token: str


def bootstrap(session: Session) -> Bootstrap | None:
    """On an empty database: one admin user, team and project, and a token for them
    (`AMITY_ADMIN_TOKEN` when set). None when there are users already."""
    if session.scalar(select(User).limit(1)) is not None:
        return None
    team = create_team(session, "default")
    user = create_user(session, "admin", team.id)
    project = create_project(session, team.id, "default")
    token = create_token(session, user.id, os.environ.get(ADMIN_TOKEN_ENV) or None)
    return Bootstrap(user, team, project, token)


def listing(session: Session) -> dict:
    """Everything `amity admin list` shows: ids and names, never tokens."""
    members: dict[str, list[str]] = {}
    for m in session.scalars(select(Membership)):
        members.setdefault(m.user_id, []).append(m.team_id)
    return {
        "users": [{"id": u.id, "name": u.name, "defaultTeamId": u.default_team_id,
                   "teamIds": sorted(members.get(u.id, []))}
                  for u in session.scalars(select(User).order_by(User.created_at, User.name))],
        "teams": [{"id": t.id, "name": t.name}
                  for t in session.scalars(select(Team).order_by(Team.created_at, Team.name))],
        "projects": [{"id": p.id, "name": p.name, "teamId": p.team_id}
                     for p in session.scalars(select(Project).order_by(Project.created_at))],
    }
