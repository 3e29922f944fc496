"""The Suite's error shape: `{"detail": [{"loc", "msg", "type"}]}` for every error, as
the spec's `HTTPValidationError` shows (FastAPI's own 422 shape). The container's
handlers (amity/server/app.py) do the same for its routes, but importing them would
load the engine; the Suite starts without torch."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("amity.suite")


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    detail: list[ErrorItem]


# Declared on every authenticated route, so the OpenAPI document (and its clients)
# know them; 422 is FastAPI's own.
COMMON_ERRORS = {
    401: {"model": ErrorBody, "description": "No token, or not a valid one."},
    403: {"model": ErrorBody, "description": "`X-Friendli-Team` names a team you are not in."},
    404: {"model": ErrorBody, "description": "No such resource in this team."},
}


# Lifecycle operations refuse transitions the endpoint's state does not allow.
TRANSITION_ERRORS = {400: {"model": ErrorBody, "description": "Not allowed in the endpoint's state."}}
# The router's own answers; the rest are the replica's.
ROUTER_ERRORS = {
    **TRANSITION_ERRORS,
    415: {"model": ErrorBody, "description": "Neither a JSON body nor a multipart form."},
    429: {"model": ErrorBody, "description": "The endpoint's queue timed out."},
    502: {"model": ErrorBody, "description": "The replica failed the request."},
    503: {"model": ErrorBody, "description": "The endpoint is still waking; retry."},
}


class ApiError(Exception):
    def __init__(self, status: int, msg: str, loc=(), type: str = "invalid_request",
                 headers: dict | None = None, commit: bool = False):
        super().__init__(msg)
        self.status, self.msg, self.loc, self.type, self.headers = status, msg, list(loc), type, headers
        self.commit = commit  # keep the request's database changes although it fails


def not_found(what: str, ident, loc=("path",)) -> ApiError:
    # Also the answer for another team's resource: a 403 would confirm that it exists.
    return ApiError(404, f"no {what} {ident!r} in this team", loc=loc, type="not_found")


def _body(status: int, detail: list[dict], headers=None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "invalid value").removeprefix(
            "Value error, "), "type": e.get("type", "value_error")} for e in exc.errors()]
        return _body(422, detail or [{"loc": ["body"], "msg": "invalid request",
                                      "type": "value_error"}])

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError):
        return _body(exc.status, [{"loc": exc.loc, "msg": exc.msg, "type": exc.type}], exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        status = 422 if exc.status_code == 400 else exc.status_code  # an undecodable body
        return _body(status, [{"loc": [], "msg": str(exc.detail), "type": "http_error"}],
                     getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s", request.url.path)
        return _body(500, [{"loc": [], "msg": f"internal error: {exc}", "type": "internal_error"}])
