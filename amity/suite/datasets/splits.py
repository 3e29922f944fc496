"""Splits and their samples. Without `versionId` the working copy is read and
changed; with it, a version's frozen copy is read (versions never change).

Bare sample ids are integers; full ids are `dataset:version:split:sample`, with
`latest` as the version part of working-copy samples. `upload_raw_samples` replaces
the split's working samples with the rows of a .jsonl or .parquet file.
"""

import json
import tempfile

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from pydantic import StrictInt
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from amity.suite.auth import Caller, caller, db
from amity.suite.datasets import schemas as s
from amity.suite.datasets.lookup import dataset_split, dataset_version, team_dataset
from amity.suite.datasets.samples import WORKING_COPY, check_sample, from_raw_row, full_id
from amity.suite.errors import ApiError, ErrorBody, not_found
from amity.suite.files.multipart import read_form
from amity.suite.pagination import Page, page_params
from amity.suite.store.models import (Dataset, File, Project, Sample, Split, VersionSample,
                                      VersionSplit, new_id, now_s)
from amity.suite.wire import Name, Text

router = APIRouter(tags=["Dataset"])
DatasetId = Path(description="ID of the dataset.")
SplitId = Path(description="ID of the split.")
MAX_SAMPLES_PER_CALL = 10_000
MAX_SAMPLE_ID = 2**31 - 1


def _split_info(split: Split | VersionSplit) -> s.SplitInfo:
    return s.SplitInfo(id=split.split_id if isinstance(split, VersionSplit) else split.id,
                       name=split.name,
                       createdAt=split.created_at, updatedAt=split.updated_at)


@router.post("/beta/dataset/{dataset_id}/split", response_model=s.SplitInfo,
             responses={409: {"model": ErrorBody,
                              "description": "The dataset has a split of that name."}},
             summary="Create a split", operation_id="create_split")
def create_split(dataset_id: Name = DatasetId, name: Name = Query(...),
                 who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    if session.scalar(select(Split).where(Split.dataset_pk == dataset.pk, Split.name == name)):
        raise ApiError(409, f"the dataset has a split named {name!r} already",
                       loc=("query", "name"), type="conflict")
    now = now_s()
    split = Split(id=new_id("split"), dataset_pk=dataset.pk, name=name, created_at=now,
                  updated_at=now)
    session.add(split)
    dataset.updated_at = now
    session.flush()
    return _split_info(split)


@router.get("/beta/dataset/{dataset_id}/split", response_model=s.ListSplitsResponse,
            summary="List splits", operation_id="list_splits")
def list_splits(dataset_id: Name = DatasetId, versionId: Name | None = Query(None),
                page: Page = Depends(page_params), who: Caller = Depends(caller),
                session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    if versionId:
        version = dataset_version(session, dataset, versionId, ("query", "versionId"))
        query, key = select(VersionSplit).where(VersionSplit.version_pk == version.pk), VersionSplit.pk
    else:
        query, key = select(Split).where(Split.dataset_pk == dataset.pk), Split.pk
    rows, cursor = page.cut(session.scalars(page.apply(query, key)).all(), lambda r: r.pk)
    return s.ListSplitsResponse(data=[_split_info(r) for r in rows], nextCursor=cursor)


@router.get("/beta/dataset/{dataset_id}/split/{split_id}", response_model=s.SplitInfo,
            summary="Get split info", operation_id="get_split")
def get_split(dataset_id: Name = DatasetId, split_id: Name = SplitId,
              who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    return _split_info(dataset_split(session, team_dataset(session, who, dataset_id), split_id))


@router.delete("/beta/dataset/{dataset_id}/split/{split_id}", response_model=dict,
               summary="Delete split", operation_id="delete_split")
def delete_split(dataset_id: Name = DatasetId, split_id: Name = SplitId,
                 who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    split = dataset_split(session, dataset, split_id)
    session.execute(delete(Split).where(Split.pk == split.pk))
    dataset.updated_at = now_s()
    return {}


def _media_checker(session: Session, who: Caller, bucket: str):
    """Media at `s3://<our bucket>/...` must be an uploaded file of the caller's team."""
    prefix = f"s3://{bucket}/"

    def check(url: str) -> str | None:
        if not url.startswith(prefix):
            return None
        file = session.scalar(select(File).join(Project, File.project_id == Project.id).where(
            File.object_key == url.removeprefix(prefix), Project.team_id == who.team_id,
            File.status == "UPLOADED"))
        return None if file else f"{url} is not an uploaded file of this team"
    return check


def _store_samples(request: Request, session: Session, who: Caller, dataset: Dataset,
                   split: Split, texts: list[str], loc: str) -> s.AddSamplesResponse:
    check_media = _media_checker(session, who, request.app.state.objects.bucket)
    for i, text in enumerate(texts):
        try:
            check_sample(text, dataset.modality, check_media)
        except ValueError as error:
            raise ApiError(422, str(error), loc=("body", loc, i), type="invalid_sample") from None
    rows = [Sample(split_pk=split.pk, data=text) for text in texts]
    session.add_all(rows)
    session.flush()
    split.updated_at = dataset.updated_at = now_s()
    return s.AddSamplesResponse(samples=[
        (full_id(dataset.id, None, split.id, row.id), row.data) for row in rows])


@router.post("/beta/dataset/{dataset_id}/split/{split_id}/sample",
             response_model=s.AddSamplesResponse, summary="Add samples",
             operation_id="add_samples")
def add_samples(request: Request, dataset_id: Name = DatasetId, split_id: Name = SplitId,
                samples: list[Text] = Body(..., max_length=MAX_SAMPLES_PER_CALL),
                who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    split = dataset_split(session, dataset, split_id)
    return _store_samples(request, session, who, dataset, split, samples, "samples")


@router.get("/beta/dataset/{dataset_id}/split/{split_id}/sample",
            response_model=s.ListSamplesResponse, summary="List samples",
            operation_id="list_samples")
def list_samples(dataset_id: Name = DatasetId, split_id: Name = SplitId,
                 versionId: Name | None = Query(None), page: Page = Depends(page_params),
                 who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    if versionId:
        version = dataset_version(session, dataset, versionId, ("query", "versionId"))
        frozen = session.scalar(select(VersionSplit).where(
            VersionSplit.version_pk == version.pk, VersionSplit.split_id == split_id))
        if frozen is None:
            raise not_found("split", split_id, ("path", "split_id"))
        query = select(VersionSample).where(VersionSample.version_split_pk == frozen.pk)
        rows, cursor = page.cut(session.scalars(page.apply(query, VersionSample.sample_id)).all(),
                                lambda r: r.sample_id)
        pairs = [(full_id(dataset.id, version.id, split_id, r.sample_id), r.data) for r in rows]
    else:
        split = dataset_split(session, dataset, split_id)
        query = select(Sample).where(Sample.split_pk == split.pk)
        rows, cursor = page.cut(session.scalars(page.apply(query, Sample.id)).all(), lambda r: r.id)
        pairs = [(full_id(dataset.id, None, split.id, r.id), r.data) for r in rows]
    return s.ListSamplesResponse(data=pairs, nextCursor=cursor)


class _SpooledUpload:
    """The uploaded file part, on disk, with the Suite's file size limit."""

    def __init__(self, max_bytes: int):
        self.file = tempfile.TemporaryFile()
        self.max_bytes, self.size, self.filename = max_bytes, 0, None

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise ApiError(422, f"the file is larger than {self.max_bytes} bytes",
                           loc=("body", "file"), type="too_large")
        self.file.write(data)

    def rows(self) -> list[str]:
        name = (self.filename or "").lower()
        if name.endswith(".parquet"):
            return self._parquet_rows()
        if self.filename and not name.endswith((".jsonl", ".json")):
            raise ApiError(422, "send the samples as a .jsonl file (one sample per line) or a "
                           ".parquet file (one sample per row)", loc=("body", "file"),
                           type="unsupported_format")
        self.file.seek(0)
        texts = []
        for number, line in enumerate(self.file, start=1):
            if not line.strip():
                continue
            try:
                texts.append(from_raw_row(json.loads(line)))
            except ValueError as error:
                raise ApiError(422, f"line {number}: {error}", loc=("body", "file"),
                               type="invalid_sample") from None
        return texts

    def _parquet_rows(self) -> list[str]:
        """Rows of a Parquet table, read a record batch at a time: the columns of a
        conversation (`messages`) or of an Alpaca record, as in a .jsonl line."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.file.seek(0)
        try:
            batches = pq.ParquetFile(self.file).iter_batches(batch_size=1024)
            texts, number = [], 0
            for batch in batches:
                for row in batch.to_pylist():
                    number += 1
                    if isinstance(row, dict):  # Parquet has no "absent": drop the nulls
                        row = {k: v for k, v in row.items() if v is not None}
                    try:
                        texts.append(from_raw_row(row))
                    except ValueError as error:
                        raise ApiError(422, f"row {number}: {error}", loc=("body", "file"),
                                       type="invalid_sample") from None
        except (pa.ArrowException, OSError) as error:
            raise ApiError(422, f"not a readable Parquet file: {error}", loc=("body", "file"),
                           type="unsupported_format") from None
        return texts


@router.put("/beta/dataset/{dataset_id}/split/{split_id}/sample",
            response_model=s.AddSamplesResponse, summary="Update samples",
            operation_id="upload_raw_samples",
            openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
                "schema": {"type": "object", "required": ["file"], "properties": {
                    "file": {"type": "string", "format": "binary",
                             "description": "File to update samples."}}}}}}})
async def upload_raw_samples(request: Request, dataset_id: Name = DatasetId,
                             split_id: Name = SplitId, who: Caller = Depends(caller),
                             session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    split = dataset_split(session, dataset, split_id)
    upload = _SpooledUpload(request.app.state.max_file_bytes)

    def open_sink(_fields: dict, filename: str | None) -> _SpooledUpload:
        upload.filename = filename
        return upload

    with upload.file:
        await read_form(request, "file", open_sink)
        texts = upload.rows()
    session.execute(delete(Sample).where(Sample.split_pk == split.pk))
    return _store_samples(request, session, who, dataset, split, texts, "file")


def _bare_id(dataset: Dataset, split: Split, ident) -> int:
    """A bare sample id, from an integer, a string of digits, or a full id of this split."""
    if isinstance(ident, str) and ident.count(":") == 3:
        dataset_id, version_id, split_id, ident = ident.split(":")
        if (dataset_id, split_id) != (dataset.id, split.id):
            raise ValueError(f"{dataset_id}:{version_id}:{split_id}:... is not a sample of this split")
        if version_id != WORKING_COPY:
            raise ValueError("a version's samples cannot be deleted: versions never change")
    if isinstance(ident, str) and ident.isascii() and ident.isdigit():
        ident = int(ident)
    if isinstance(ident, int) and not isinstance(ident, bool) and 0 < ident <= MAX_SAMPLE_ID:
        return ident
    raise ValueError(f"{ident!r} is not a sample id: send the bare id or the full id")


@router.post("/beta/dataset/{dataset_id}/split/{split_id}/sample/delete",
             response_model=s.DeleteSamplesResponse, summary="Delete samples",
             operation_id="delete_samples")
def delete_samples(dataset_id: Name = DatasetId, split_id: Name = SplitId,
                   sample_ids: list[Name | StrictInt] = Body(..., max_length=MAX_SAMPLES_PER_CALL),
                   who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    split = dataset_split(session, dataset, split_id)
    wanted = []
    for i, ident in enumerate(sample_ids):
        try:
            wanted.append(_bare_id(dataset, split, ident))
        except ValueError as error:
            raise ApiError(422, str(error), loc=("body", i), type="invalid_sample_id") from None
    found = set(session.scalars(select(Sample.id).where(Sample.split_pk == split.pk,
                                                        Sample.id.in_(wanted))))
    missing = [i for i in wanted if i not in found]
    if missing:
        raise not_found("sample", missing[0], ("body",))
    session.execute(delete(Sample).where(Sample.id.in_(found)))
    split.updated_at = dataset.updated_at = now_s()
    return s.DeleteSamplesResponse(sampleIds=[full_id(dataset.id, None, split.id, i)
                                              for i in dict.fromkeys(wanted)])
