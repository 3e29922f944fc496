"""The Suite's FastAPI application: the database, the object store, the routers, the
error shape. `serve` is `amity suite`."""

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, Request
from sqlalchemy.orm import Session, sessionmaker

from amity.config import StoreConfig, SuiteConfig, parse_memory
from amity.suite import router
from amity.suite.accounts import bootstrap
from amity.suite.callers import TtlCache
from amity.suite.endpoints import routes as endpoint_routes
from amity.suite.endpoints.artifacts import LocalArtifacts, WandbArtifacts
from amity.suite.endpoints.controller import Controller
from amity.suite.endpoints.repos import CannotResolve, resolve_model
from amity.suite.datasets import routes as dataset_routes
from amity.suite.datasets import splits as split_routes
from amity.suite.errors import (COMMON_ERRORS, ROUTER_ERRORS, TRANSITION_ERRORS, ApiError,
                                install_error_handlers)
from amity.suite.files import routes as file_routes
from amity.suite.files import transfer
from amity.suite.files.local import LocalStore
from amity.suite.files.objects import ObjectStore
from amity.suite.files.s3 import S3Store
from amity.suite.files.signing import Signer, signing_key
from amity.suite.knowledge import routes as knowledge_routes
from amity.suite.knowledge.service import Knowledge
from amity.suite.replicas.backend import ReplicaFailed, ReplicaSpec
from amity.suite.replicas.manager import ReplicaManager, open_backend
from amity.suite.serverless import inference as serverless_inference
from amity.suite.serverless import routes as serverless_routes
from amity.suite.serverless.catalog import load_catalog
from amity.suite.serverless.endpoints import ServerlessReplicas, parse_model_urls
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


async def _no_nul_in_url(request: Request) -> None:
    """A NUL in a path or query value would reach the database (PostgreSQL refuses it).
    Async: a check this small is not worth a trip to the thread pool on every request."""
    values = [*request.path_params.values(), *request.query_params.values()]
    if any("\x00" in str(v) for v in values):
        raise ApiError(422, "the URL must not contain NUL characters", loc=("path",),
                       type="value_error")


@asynccontextmanager
async def running(app: FastAPI):
    """Replicas and endpoints live as long as the app: the controller brings every
    endpoint back to its desired state, the default model's container starts in the
    background (the platform routes answer meanwhile); all replicas stop at the end."""
    config, data = app.state.config, app.state.data_dir
    manager = ReplicaManager(open_backend(config, data), config)
    registry = Path(config.model_registry) if config.model_registry else data / "models"
    artifacts = (LocalArtifacts(Path(config.wandb_artifact_dir)) if config.wandb_artifact_dir
                 else WandbArtifacts(data / "cache" / "wandb"))
    controller = Controller(config, app.state.sessions, manager, app.state.objects, registry,
                            data / "cache" / "files", artifacts)
    serverless = ServerlessReplicas(manager, config, app.state.serverless_model_urls,
                                    data / "cache" / "models")
    app.state.replicas, app.state.controller = manager, controller
    app.state.serverless = serverless
    manager.start()
    serverless.start()
    await controller.start()
    container = None
    if config.container_model != "none":
        container = asyncio.get_running_loop().create_task(
            _start_container(manager, config.container_model, registry))
    try:
        yield
    finally:
        if container is not None:
            container.cancel()
        await serverless.close()
        await controller.close()
        await manager.close()
        app.state.knowledge.close()


async def _start_container(manager: ReplicaManager, model: str, registry: Path) -> None:
    try:
        path = resolve_model(model, None, registry=registry)
        spec = ReplicaSpec(str(path), None, manager.common_flags)
        await manager.ensure(router.DEFAULT_CONTAINER, spec)
        print(f"amity suite: the container of {model} is ready; its API answers here too",
              flush=True)
    except (CannotResolve, ReplicaFailed) as error:
        manager.failures[router.DEFAULT_CONTAINER] = str(error)
        log.error("the container of %s did not start: %s", model, error)


def build_app(config: SuiteConfig, sessions: sessionmaker[Session], objects: ObjectStore,
              data: Path) -> FastAPI:
    app = FastAPI(title="amity Suite: the Friendli Suite platform API", version="0.1.0",
                  dependencies=[Depends(_no_nul_in_url)], lifespan=running)
    app.state.data_dir = data
    app.state.config = config
    app.state.sessions = sessions
    app.state.callers = TtlCache(config.auth_cache_ttl_s)
    app.state.objects = objects
    app.state.max_file_bytes = parse_memory(config.max_file_size, 0)
    app.state.catalog = load_catalog(config.catalog)
    app.state.serverless_model_urls = parse_model_urls(config.serverless_model_urls)
    app.state.tool_settings = ToolSettings.from_config(config)
    app.state.knowledge = Knowledge.from_config(config, sessions)
    install_error_handlers(app)
    for module in (file_routes, dataset_routes, split_routes, serverless_routes, knowledge_routes):
        app.include_router(module.router, responses=COMMON_ERRORS)
    app.include_router(serverless_inference.router, responses={**COMMON_ERRORS, **ROUTER_ERRORS})
    app.include_router(transfer.router)

    app.include_router(endpoint_routes.router, responses={**COMMON_ERRORS, **TRANSITION_ERRORS})
    app.include_router(router.dedicated, responses={**COMMON_ERRORS, **ROUTER_ERRORS})
    app.include_router(router.container)
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
        else:
            # Only the token's hash is kept: it cannot be shown again.
            announce("amity suite: existing data directory; its first start printed the token "
                     "of the admin user (`amity admin create-token` makes another)")
    return Suite(build_app(config, sessions, open_object_store(config, store, sessions),
                           data_dir(store)), sessions)


def serve(config: SuiteConfig, store: StoreConfig) -> int:
    suite = open_suite(config, store, announce=lambda line: print(line, flush=True))
    print(f"amity suite: serving on {public_url(config)}", flush=True)
    if config.container_model != "none":
        print(f"amity suite: starting a container of {config.container_model}; the container "
              f"API (/v1/..., /classify, /metrics) answers at {public_url(config)} once it has "
              "loaded (/health says when)", flush=True)
    # httptools, not h11, and uvloop, not asyncio's loop: each cuts the Suite's CPU per
    # relayed chunk (benchmarks/README.md, "Router"). Named here, not left to what is
    # installed (`amity serve` runs its own `asyncio.run` and names h11).
    uvicorn.run(suite.app, host=config.host, port=config.port, log_level="info", http="httptools",
                loop="uvloop")
    return 0
