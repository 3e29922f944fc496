"""Who is asking, and as which team: the bearer token and `X-Friendli-Team`.

- no token, or one that is not ours: 401;
- `X-Friendli-Team` absent (or the 0.12.8 SDK's unset sentinel, which its dataset
  helper sends literally): the token owner's default team;
- a team the user is not a member of (or that does not exist): 403.
Resources of other teams are then simply not found (404), in `scoped` queries.
A caller once checked is trusted for `auth_cache_ttl_s` seconds (callers.py).
"""

import hmac
from dataclasses import dataclass

import anyio.to_thread
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from amity.suite.accounts import token_sha256
from amity.suite.callers import TtlCache
from amity.suite.errors import ApiError, not_found
from amity.suite.store.models import Membership, Project, Token, User

SDK_UNSET_TEAM = "~?~unset~?~sentinel~?~"

bearer = HTTPBearer(auto_error=False, description="A Suite token (`amity admin create-token`).")


def db(request: Request):
    """One session per request, committed when the route returns without an error (or
    with an ApiError that says its changes stand, such as a FAILED verification).
    Used with `scope="function"`: the commit happens before the response is sent, so a
    client's next request sees it."""
    session = request.app.state.sessions()
    try:
        yield session
        session.commit()
    except ApiError as error:
        session.commit() if error.commit else session.rollback()
        raise
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@dataclass(frozen=True)
class Caller:
    user_id: str
    team_id: str


def _unauthorized(msg: str) -> ApiError:
    return ApiError(401, msg, loc=("header", "Authorization"), type="unauthorized",
                    headers={"WWW-Authenticate": "Bearer"})


def _look_up(sessions: sessionmaker, digest: str, team_id: str | None) -> Caller:
    """The caller of token `digest` as team `team_id` (None: the owner's default team),
    from the database, in a session of its own that ends here."""
    with sessions() as session:
        token = session.scalar(select(Token).where(Token.sha256 == digest))
        # The lookup is by hash, so timing says nothing about the token; the compare
        # keeps it that way should the lookup ever change.
        if token is None or not hmac.compare_digest(token.sha256, digest):
            raise _unauthorized("the token is not valid")
        user = session.get(User, token.user_id)
        if team_id is None:
            return Caller(user.id, user.default_team_id)
        if session.get(Membership, (user.id, team_id)) is None:
            raise ApiError(403, f"you are not a member of team {team_id!r}",
                           loc=("header", "X-Friendli-Team"), type="forbidden")
        return Caller(user.id, team_id)


async def caller(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    x_friendli_team: str | None = Header(None, description="ID of team to run requests as."),
) -> Caller:
    """Async, and without the request's database session: a checked caller comes from
    the app's cache without leaving the event loop, and a lookup holds a pooled
    connection only while it runs, not for the rest of the request (a long inference
    would keep it, and the pool would run dry under concurrent requests)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("send `Authorization: Bearer <token>`")
    team_id = None if x_friendli_team in (None, "", SDK_UNSET_TEAM) else x_friendli_team
    key = (token_sha256(credentials.credentials), team_id)
    known: TtlCache[Caller] = request.app.state.callers
    return await known.get_or_load(
        key, lambda: anyio.to_thread.run_sync(_look_up, request.app.state.sessions, *key))


def team_project(session: Session, who: Caller, project_id: str, loc) -> Project:
    project = session.get(Project, project_id)
    if project is None or project.team_id != who.team_id:
        raise not_found("project", project_id, loc)
    return project
