"""The local object store's own URLs: the presigned POST target and signed downloads.
Neither takes a bearer token: the signature is the permission (as with S3)."""

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from amity.suite.errors import ApiError, ErrorBody
from amity.suite.files.local import Incoming, LocalStore
from amity.suite.files.multipart import read_form

router = APIRouter(tags=["Objects"])

_ERRORS = {400: {"model": ErrorBody, "description": "More bytes than the policy allows."},
           403: {"model": ErrorBody, "description": "Bad or expired signature."},
           409: {"model": ErrorBody, "description": "The object is uploaded already."},
           422: {"model": ErrorBody, "description": "Not a multipart form with a `file` part."}}


def _local(request: Request) -> LocalStore:
    store = request.app.state.objects
    if not isinstance(store, LocalStore):
        raise ApiError(404, "this Suite keeps its objects in S3", type="not_found")
    return store


@router.post("/objects/upload", status_code=204, responses=_ERRORS,
             summary="Upload an object (S3-style presigned POST form)")
async def upload(request: Request) -> Response:
    store = _local(request)
    arriving: list[Incoming] = []

    def open_sink(fields: dict, _filename: str | None) -> Incoming:
        arriving.append(store.accept(fields))
        return arriving[0]

    try:
        fields = await read_form(request, "file", open_sink)
        store.store(fields["key"], arriving[0])
    except BaseException:
        if arriving:
            arriving[0].discard()
        raise
    return Response(status_code=204)


@router.get("/objects/{key:path}", response_class=FileResponse,
            responses={403: _ERRORS[403],
                       404: {"model": ErrorBody, "description": "No such object."}},
            summary="Download an object (signed, expiring URL)")
def download(request: Request, key: str, expires: str = Query(...),
             signature: str = Query(...)) -> FileResponse:
    return FileResponse(_local(request).open_download(key, expires, signature),
                        media_type="application/octet-stream")
