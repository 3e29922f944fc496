"""The 12 lifecycle operations of dedicated endpoints (`/dedicated/beta/endpoint...`
and the W&B create). Rows change in their own committed transactions before the
controller acts on them, so its task always finds what the route wrote."""

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Path, Request
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from amity.suite.accounts import create_project
from amity.suite.auth import Caller, caller, db, team_project
from amity.suite.endpoints import schemas as s
from amity.suite.endpoints.artifacts import parse_artifact
from amity.suite.endpoints.controller import Controller, InvalidTransition, utcnow
from amity.suite.endpoints.instances import INSTANCE_OPTIONS, device_profile
from amity.suite.endpoints.repos import WANDB_PREFIX
from amity.suite.errors import ApiError, not_found
from amity.suite.pagination import Page, page_params
from amity.suite.store.models import Endpoint, EndpointVersion, Project, Team, new_id
from amity.suite.wire import Name

router = APIRouter(tags=["Dedicated.Endpoint"])
EndpointId = Path(description="The ID of the endpoint.")
BASE = "/dedicated/beta/endpoint"


def _controller(request: Request) -> Controller:
    return request.app.state.controller


def _config(body, previous: dict | None = None) -> dict:
    """The stored configuration: the body's fields, scaling made explicit."""
    config = dict(previous or {})
    for key in ("instanceOptionId", "hfModelRepo"):
        if getattr(body, key, None) is not None:
            config[key] = getattr(body, key)
    if body.hfModelRepo is not None or previous is None:
        config["hfModelRepoRevision"] = body.hfModelRepoRevision
    elif body.hfModelRepoRevision is not None:
        config["hfModelRepoRevision"] = body.hfModelRepoRevision
    if body.advanced is not None:
        config["advanced"] = body.advanced.model_dump()
    if body.simplescale is not None:
        n = body.simplescale.replicas
        config.update(minReplica=n, maxReplica=n, cooldownPeriod=0, simplescale=True)
    elif body.autoscalingPolicy is not None or previous is None:
        policy = body.autoscalingPolicy or s.AutoscalingPolicy()
        config.update(minReplica=policy.minReplica, maxReplica=policy.maxReplica,
                      cooldownPeriod=policy.cooldownPeriod, simplescale=False)
    if device_profile(config["instanceOptionId"]) is None:
        raise ApiError(422, f"unknown instanceOptionId {config['instanceOptionId']!r}",
                       loc=("body", "instanceOptionId"), type="value_error")
    return config


def _utc(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; they were written in UTC.
    return moment.replace(tzinfo=UTC) if moment and moment.tzinfo is None else moment


def status_of(row: Endpoint) -> s.DedicatedEndpointStatus:
    return s.DedicatedEndpointStatus(id=row.id, status=row.status, errorCode=row.error_code,
                                     createdAt=_utc(row.created_at), updatedAt=_utc(row.updated_at),
                                     phase=row.phase)


def fresh_status(request: Request, endpoint_id: str) -> s.DedicatedEndpointStatus:
    """The status as the controller just wrote it (the request's own session may
    still see the snapshot it read before)."""
    with request.app.state.sessions() as session:
        return status_of(session.scalar(select(Endpoint).where(Endpoint.id == endpoint_id)))


def spec_of(row: Endpoint, config: dict, controller: Controller, comment=None,
            created=None) -> s.DedicatedEndpointSpec:
    profile = device_profile(config["instanceOptionId"])
    advanced = config["advanced"]
    current, desired = controller.counts(row.id) if controller else (None, None)
    return s.DedicatedEndpointSpec(
        id=row.id, name=config.get("name", row.name), gpuType=profile.gpu_type,
        numGpu=profile.num_gpu, instanceId=config["instanceOptionId"], projectId=row.project_id,
        creatorId=row.creator_id, teamId=row.team_id, autoscalingMin=config["minReplica"],
        autoscalingMax=config["maxReplica"], autoscalingCooldown=config["cooldownPeriod"],
        maxBatchSize=advanced.get("max_batch_size") or controller.config.replica_concurrency,
        maxInputLength=advanced.get("max_input_length"),
        tokenizerSkipSpecialTokens=advanced["tokenizer_skip_special_tokens"],
        tokenizerAddSpecialTokens=advanced["tokenizer_add_special_tokens"],
        currReplicaCnt=current, desiredReplicaCnt=desired, updatedReplicaCnt=current,
        hfModelRepo=config["hfModelRepo"], versionComment=comment, createdAt=_utc(created))


def team_endpoint(session: Session, who: Caller, endpoint_id: str) -> Endpoint:
    row = session.scalar(select(Endpoint).where(Endpoint.id == endpoint_id))
    if row is None or row.team_id != who.team_id:
        raise not_found("endpoint", endpoint_id)
    return row


def _add_version(session: Session, row: Endpoint, comment: str | None) -> None:
    number = session.scalar(select(func.count()).select_from(EndpointVersion).where(
        EndpointVersion.endpoint_pk == row.pk))
    session.add(EndpointVersion(endpoint_pk=row.pk, number=number, config=dict(row.config),
                                comment=comment, created_at=utcnow()))


def _create(request: Request, who: Caller, project: Project, name: str, config: dict,
            comment: str | None, idempotency_key: str | None = None) -> Endpoint:
    now = utcnow()
    with request.app.state.sessions.begin() as session:
        row = Endpoint(id=new_id("ep"), team_id=who.team_id, project_id=project.id,
                       creator_id=who.user_id, name=name, config={**config, "name": name},
                       status="INITIALIZING", phase="REQUESTING_VIRTUAL_MACHINE", desired="running",
                       idempotency_key=idempotency_key, created_at=now, updated_at=now)
        session.add(row)
        session.flush()
        _add_version(session, row, comment)
    _controller(request).deploy(row)
    return row


@router.post(BASE, response_model=s.DedicatedEndpointStatus, summary="Create a new endpoint",
             operation_id="dedicatedCreateEndpoint")
async def create_endpoint(request: Request, body: s.DedicatedEndpointCreateBody,
                          who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    project = team_project(session, who, body.projectId, ("body", "projectId"))
    row = _create(request, who, project, body.name, _config(body), body.initialVersionComment)
    return status_of(row)


@router.get(BASE, response_model=s.DedicatedEndpointListResponse, summary="List all endpoints",
            operation_id="dedicatedListEndpoints")
async def list_endpoints(project_id: str = "", page: Page = Depends(page_params),
                         who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    query = select(Endpoint).where(Endpoint.team_id == who.team_id)
    if project_id:
        query = query.where(Endpoint.project_id == project_id)
    page.direction = None
    rows, cursor = page.cut(session.scalars(page.apply(query, Endpoint.pk)).all(), lambda r: r.pk)
    return s.DedicatedEndpointListResponse(data={r.id: status_of(r) for r in rows}, nextCursor=cursor)


@router.get(BASE + "/{endpoint_id}", response_model=s.DedicatedEndpointSpec,
            summary="Get endpoint specification", operation_id="dedicatedGetEndpoint")
async def get_endpoint(request: Request, endpoint_id: Name = EndpointId, who: Caller = Depends(caller),
                       session: Session = Depends(db, scope="function")):
    row = team_endpoint(session, who, endpoint_id)
    return spec_of(row, row.config, _controller(request))


@router.put(BASE + "/{endpoint_id}", response_model=s.DedicatedEndpointSpec,
            summary="Update endpoint spec", operation_id="dedicatedUpdateEndpoint")
async def update_endpoint(request: Request, body: s.DedicatedEndpointUpdateBody,
                          endpoint_id: Name = EndpointId, who: Caller = Depends(caller),
                          session: Session = Depends(db, scope="function")):
    row = team_endpoint(session, who, endpoint_id)
    config = _config(body, row.config)
    if body.name is not None:
        config["name"] = body.name
    keys = ("hfModelRepo", "hfModelRepoRevision", "advanced", "instanceOptionId")
    rolls = any(config.get(k) != row.config.get(k) for k in keys)
    controller = _controller(request)
    try:
        controller.check_update(row.status)
    except InvalidTransition as error:
        raise ApiError(400, str(error), loc=("path", "endpoint_id"), type="invalid_state") from None
    with request.app.state.sessions.begin() as tx:
        row = tx.scalar(select(Endpoint).where(Endpoint.id == endpoint_id))
        row.config, row.name, row.updated_at = config, config["name"], utcnow()
        _add_version(tx, row, body.newVersionComment)
    controller.update(row, rolls)
    return spec_of(row, config, controller)


@router.delete(BASE + "/{endpoint_id}", response_model=dict, summary="Delete endpoint",
               operation_id="dedicatedDeleteEndpoint")
async def delete_endpoint(request: Request, endpoint_id: Name = EndpointId,
                          who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    team_endpoint(session, who, endpoint_id)
    await _controller(request).delete(endpoint_id)
    with request.app.state.sessions.begin() as tx:
        tx.execute(delete(Endpoint).where(Endpoint.id == endpoint_id))
    return {}


@router.get(BASE + "/{endpoint_id}/version",
            response_model=s.DedicatedEndpointVersionHistoryResponse,
            summary="Get endpoint version history", operation_id="dedicatedGetEndpointVersionHistory")
async def version_history(request: Request, endpoint_id: Name = EndpointId,
                          page: Page = Depends(page_params), who: Caller = Depends(caller),
                          session: Session = Depends(db, scope="function")):
    row = team_endpoint(session, who, endpoint_id)
    page.direction = None
    query = select(EndpointVersion).where(EndpointVersion.endpoint_pk == row.pk)
    versions, cursor = page.cut(session.scalars(page.apply(query, EndpointVersion.number)).all(),
                                lambda v: v.number)
    controller = _controller(request)
    return s.DedicatedEndpointVersionHistoryResponse(
        data={str(v.number): spec_of(row, v.config, controller, v.comment, v.created_at)
              for v in versions}, nextCursor=cursor)


@router.get(BASE + "/{endpoint_id}/status", response_model=s.DedicatedEndpointStatus,
            summary="Get endpoint status", operation_id="dedicatedGetEndpointStatus")
async def get_status(endpoint_id: Name = EndpointId, who: Caller = Depends(caller),
                     session: Session = Depends(db, scope="function")):
    return status_of(team_endpoint(session, who, endpoint_id))


def _transition(name: str, summary: str):
    async def operation(request: Request, endpoint_id: Name = EndpointId,
                        who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
        row = team_endpoint(session, who, endpoint_id)
        try:
            getattr(_controller(request), name)(row)
        except InvalidTransition as error:
            raise ApiError(400, str(error), loc=("path", "endpoint_id"), type="invalid_state") from None
        return fresh_status(request, endpoint_id)

    router.put(BASE + "/{endpoint_id}/" + name, response_model=s.DedicatedEndpointStatus,
               summary=summary, operation_id=f"dedicated{name.title()}Endpoint")(operation)


_transition("sleep", "Sleep endpoint")
_transition("wake", "Wake endpoint")
_transition("terminate", "Terminate endpoint")
_transition("restart", "Restart endpoint")


@router.post("/dedicated/endpoint/wandb-artifact-create",
             response_model=s.DedicatedEndpointWandbArtifactCreateResponse,
             summary="Create endpoint from W&B artifact",
             operation_id="dedicatedEndpointWandbArtifactCreate")
async def wandb_artifact_create(request: Request, body: s.DedicatedEndpointWandbArtifactCreateBody,
                                who: Caller = Depends(caller),
                                session: Session = Depends(db, scope="function")):
    try:
        parse_artifact(body.wandbArtifactVersionName)
    except ValueError as error:
        raise ApiError(422, str(error), loc=("body", "wandbArtifactVersionName"),
                       type="value_error") from None
    if body.idempotencyKey is not None and body.projectId is None:
        raise ApiError(400, "`projectId` is required with `idempotencyKey`", loc=("body", "projectId"))
    if body.projectId is not None:
        project = team_project(session, who, body.projectId, ("body", "projectId"))
    else:
        with request.app.state.sessions.begin() as tx:
            project = create_project(tx, who.team_id, f"wandb-{new_id('p')[2:]}")
    repo = WANDB_PREFIX + body.wandbArtifactVersionName
    existing = None
    if body.idempotencyKey is not None:
        existing = session.scalar(select(Endpoint).where(
            Endpoint.team_id == who.team_id, Endpoint.idempotency_key == body.idempotencyKey))
    if existing is not None:  # roll the existing endpoint out to this artifact
        update = s.DedicatedEndpointUpdateBody(hfModelRepo=repo, autoscalingPolicy=body.autoscalingPolicy,
                                               name=body.name,
                                               newVersionComment=f"W&B {body.wandbArtifactVersionName}")
        await update_endpoint(request, update, existing.id, who, session)
        row = existing
    else:
        option = "cpu"
        if body.accelerator is not None:
            option = next((o for o, (gpu, n) in INSTANCE_OPTIONS.items()
                if body.accelerator.type.lower() in gpu.lower() and n == body.accelerator.count), None)
            if option is None:
                raise ApiError(422, f"no instance offers {body.accelerator.count}x "
                               f"{body.accelerator.type}", loc=("body", "accelerator"))
        create = s.DedicatedEndpointCreateBody(
            projectId=project.id, name=body.name or body.wandbArtifactVersionName.split("/")[-1].replace(":", "-"),
            instanceOptionId=option, hfModelRepo=repo, autoscalingPolicy=body.autoscalingPolicy,
            advanced=s.EndpointAdvancedConfig(tokenizer_skip_special_tokens=True,
                                              tokenizer_add_special_tokens=False),
            initialVersionComment=f"W&B {body.wandbArtifactVersionName}")
        row = _create(request, who, project, create.name, _config(create),
                      create.initialVersionComment, body.idempotencyKey)
    team = session.get(Team, who.team_id)
    return s.DedicatedEndpointWandbArtifactCreateResponse(
        endpointId=row.id, endpointName=body.name or row.name, projectId=project.id,
        projectName=project.name, teamId=who.team_id, teamName=team.name if team else None)
