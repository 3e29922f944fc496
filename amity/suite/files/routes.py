"""The Files API (`/beta/file...`), in the order the SDK drives it:

init (dedupe by project + digest + size: 200 without an upload URL; otherwise 202
with the presigned POST) -> the client POSTs the bytes to the object store -> complete
(the stored size and sha256 must match the declared ones: UPLOADED, or FAILED and a
422) -> info -> download URL.
"""

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from amity.suite.auth import Caller, caller, db, team_project
from amity.suite.errors import ApiError, ErrorBody, not_found
from amity.suite.files import schemas as s
from amity.suite.files.objects import object_key, s3_uri
from amity.suite.store.models import File, Project, new_id
from amity.suite.wire import Name

router = APIRouter(tags=["File"])
FileId = Name  # path parameter: bounded, NUL-free


def _utc(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes (we store UTC); PostgreSQL aware ones.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _expired(file: File) -> bool:
    return file.expires_at is not None and _utc(file.expires_at) <= datetime.now(UTC)


def _status(file: File) -> str:
    return "DELETED" if _expired(file) else file.status


def _team_file(session: Session, who: Caller, file_id: str) -> File:
    file = session.scalar(select(File).join(Project, File.project_id == Project.id).where(
        File.id == file_id, Project.team_id == who.team_id))
    if file is None:
        raise not_found("file", file_id)
    return file


@router.post("/beta/file", status_code=202, response_model=s.FileInitUploadResponse,
             responses={200: {"model": s.FileInitUploadResponse,
                              "description": "The file is uploaded already."}},
             summary="Initiate file upload", operation_id="init_upload")
def init_upload(request: Request, body: s.FileInitUploadRequest,
                who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    project = team_project(session, who, body.projectId, ("body", "projectId"))
    limit = request.app.state.max_file_bytes
    if body.size > limit:
        raise ApiError(422, f"files may be at most {limit} bytes", loc=("body", "size"),
                       type="too_large")
    known = session.scalars(select(File).where(
        File.project_id == project.id, File.digest == body.digest, File.size == body.size,
        File.status == "UPLOADED")).all()
    for file in known:
        if not _expired(file):
            return JSONResponse({"fileId": file.id, "uploadUrl": None, "aws": None}, status_code=200)
    file_id = new_id("file")
    ttl = request.app.state.config.file_ttl_s
    now = datetime.now(UTC)
    file = File(id=file_id, project_id=project.id, creator_id=who.user_id, name=body.name,
                size=body.size, digest=body.digest, status="UPLOADING",
                object_key=object_key(project.id, file_id), created_at=now,
                expires_at=now + timedelta(seconds=ttl) if ttl is not None else None)
    session.add(file)
    form = request.app.state.objects.upload_form(file.object_key, body.size)
    return s.FileInitUploadResponse(fileId=file_id, uploadUrl=form.url, aws=form.fields)


@router.patch("/beta/file/{file_id}", response_model=dict,
              summary="Complete file upload", operation_id="complete_upload")
def complete_upload(request: Request, file_id: FileId = Path(description="File ID"),
                    who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    file = _team_file(session, who, file_id)
    status = _status(file)
    if status == "UPLOADED":
        return {}
    if status != "UPLOADING":
        raise ApiError(422, f"the file is {status}; start a new upload", loc=("path", "file_id"),
                       type="invalid_state")
    store = request.app.state.objects
    stat = store.stat(file.object_key)
    if stat is None:
        raise ApiError(422, "nothing was uploaded for this file yet: POST it to the upload URL "
                            "first", loc=("path", "file_id"), type="not_uploaded")
    if stat.size != file.size or "sha256:" + stat.sha256 != file.digest:
        file.status = "FAILED"
        store.delete(file.object_key)
        raise ApiError(422, f"the uploaded bytes do not match: {stat.size} bytes with digest "
                            f"sha256:{stat.sha256}, declared {file.size} bytes with {file.digest}",
                       loc=("path", "file_id"), type="digest_mismatch", commit=True)
    file.status = "UPLOADED"
    return {}


@router.get("/beta/file/{file_id}", response_model=s.FileInfo,
            summary="Get file info", operation_id="get_info")
def get_info(file_id: FileId = Path(description="File ID"), who: Caller = Depends(caller),
             session: Session = Depends(db, scope="function")):
    file = _team_file(session, who, file_id)
    return s.FileInfo(id=file.id, name=file.name, size=file.size, digest=file.digest,
                      projectId=file.project_id, creatorId=file.creator_id,
                      createdAt=_utc(file.created_at),
                      expiresAt=_utc(file.expires_at) if file.expires_at else None,
                      status=_status(file))


@router.get("/beta/file/{file_id}/download_url", response_model=s.FileGetDownloadUrlResponse,
            responses={409: {"model": ErrorBody, "description": "The file is not UPLOADED."}},
            summary="Get file download URL", operation_id="get_download_url")
def get_download_url(request: Request, file_id: FileId = Path(description="File ID"),
                     who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    file = _team_file(session, who, file_id)
    status = _status(file)
    if status != "UPLOADED":
        raise ApiError(409, f"the file is {status}, not UPLOADED: complete the upload first",
                       loc=("path", "file_id"), type="invalid_state")
    store = request.app.state.objects
    return s.FileGetDownloadUrlResponse(fileId=file.id, s3Uri=s3_uri(store, file.object_key),
                                        downloadUrl=store.download_url(file.object_key))
