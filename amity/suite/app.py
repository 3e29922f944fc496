"""The Suite's FastAPI application: the database, the object store, the routers, the
error shape. `serve` is `amity suite`."""

import logging
from dataclasses import dataclass

import uvicorn
from fastapi import Depends, FastAPI, Request
from sqlalchemy.orm import Session, sessionmaker

from amity.config import StoreConfig, SuiteConfig, parse_memory
from amity.suite.accounts import bootstrap
from amity.suite.datasets import routes as dataset_routes
from amity.suite.datasets import splits as split_routes
from amity.suite.errors import COMMON_ERRORS, ApiError, install_error_handlers
from amity.suite.files import routes as file_routes
from amity.suite.files import transfer
from amity.suite.files.local import LocalStore
from amity.suite.files.objects import ObjectStore
from amity.suite.files.s3 import S3Store
from amity.suite.files.signing import Signer, signing_key
from amity.suite.serverless import routes as serverless_routes
from amity.suite.serverless.catalog import load_catalog
from amity.suite.serverless.endpoints import StaticEndpoints
from amity.suite.store.database import data_dir, open_database
from amity.suite.tools.base import ToolSettings

log = logging.getLogger("amity.suite")


def public_url(config: SuiteConfig) -> str:
    if config.public_url:
        return config.public_url.rstrip("/")
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    return f"http://{host}:{config.port}"


def open_object_store(config: SuiteConfig, store: StoreConfig, sessions: sessionmaker) -> ObjectStore:
    if config.object_store == "local":
        with sessions() as session:
            signer = Signer(signing_key(session))
        return LocalStore(data_dir(store) / "objects", signer, public_url(config), config.url_ttl_s)
    if config.object_store.startswith("s3://"):
        bucket = config.object_store.removeprefix("s3://").strip("/")
        return S3Store(bucket, config.s3_endpoint_url, config.url_ttl_s)
    raise ValueError(f"--object-store is `local` or `s3://BUCKET`, not {config.object_store!r}")


def _no_nul_in_url(request: Request) -> None:
    """A NUL in a path or query value would reach the database (PostgreSQL refuses it)."""
    values = [*request.path_params.values(), *request.query_params.values()]
    if any("\x00" in str(v) for v in values):
        raise ApiError(422, "the URL must not contain NUL characters", loc=("path",),
                       type="value_error")


def build_app(config: SuiteConfig, sessions: sessionmaker[Session], objects: ObjectStore) -> FastAPI:
    app = FastAPI(title="amity Suite: the Friendli Suite platform API", version="0.1.0",
                  dependencies=[Depends(_no_nul_in_url)])
    app.state.config = config
    app.state.sessions = sessions
    app.state.objects = objects
    app.state.max_file_bytes = parse_memory(config.max_file_size, 0)
    app.state.catalog = load_catalog(config.catalog)
    app.state.endpoints = StaticEndpoints(config.serverless_model_urls)
    app.state.tool_settings = ToolSettings.from_config(config)
    install_error_handlers(app)
    for module in (file_routes, dataset_routes, split_routes, serverless_routes):
        app.include_router(module.router, responses=COMMON_ERRORS)
    app.include_router(transfer.router)

    @app.get("/health", tags=["Health"])
    def health():
        return {"status": "ok"}

    return app


@dataclass
class Suite:
    app: FastAPI
    sessions: sessionmaker[Session]


def open_suite(config: SuiteConfig, store: StoreConfig, announce=print) -> Suite:
    """Migrate the database, bootstrap an empty one (announcing its admin token once),
    open the object store, build the app."""
    sessions = open_database(store)
    with sessions.begin() as session:
        created = bootstrap(session)
        if created is not None:
            announce(f"amity suite: created admin user {created.user.id}, team {created.team.id}, "
                     f"project {created.project.id}")
            announce(f"amity suite: admin token (shown once): {created.token}")
    return Suite(build_app(config, sessions, open_object_store(config, store, sessions)), sessions)


def serve(config: SuiteConfig, store: StoreConfig) -> int:
    suite = open_suite(config, store, announce=lambda line: print(line, flush=True))
    print(f"amity suite: serving on {public_url(config)}", flush=True)
    uvicorn.run(suite.app, host=config.host, port=config.port, log_level="info")
    return 0
