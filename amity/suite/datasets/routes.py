"""Datasets and their versions. A version is a snapshot of the whole dataset (all
splits and their samples, copied), whatever the spec's "state of the split" says:
the operation is dataset-scoped. Deleting a dataset cascades (foreign keys)."""

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy import delete, insert, literal, select
from sqlalchemy.orm import Session

from amity.suite.auth import Caller, caller, db, team_project
from amity.suite.datasets import schemas as s
from amity.suite.datasets.lookup import dataset_info, dataset_version, team_dataset
from amity.suite.pagination import Page, page_params
from amity.suite.store.models import (Dataset, Sample, Split, Version, VersionSample, VersionSplit,
                                      new_id, now_s)
from amity.suite.wire import Name, Text

router = APIRouter(tags=["Dataset"])
DatasetId = Path(description="ID of the dataset.")


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@router.post("/beta/dataset", response_model=s.DatasetInfo, summary="Create a new dataset",
             operation_id="create_dataset")
def create_dataset(body: s.CreateDatasetRequest, who: Caller = Depends(caller),
                   session: Session = Depends(db, scope="function")):
    project = team_project(session, who, body.projectId, ("body", "projectId"))
    now = now_s()
    dataset = Dataset(id=new_id("ds"), project_id=project.id, name=body.name,
                      modality=body.modality.model_dump(), created_at=now, updated_at=now)
    session.add(dataset)
    session.flush()
    return dataset_info(dataset)


@router.get("/beta/dataset", response_model=s.ListDatasetsResponse, summary="List datasets",
            operation_id="list_datasets")
def list_datasets(projectId: Name = Query(...), nameSearch: Name | None = Query(None),
                  page: Page = Depends(page_params), who: Caller = Depends(caller),
                  session: Session = Depends(db, scope="function")):
    project = team_project(session, who, projectId, ("query", "projectId"))
    query = select(Dataset).where(Dataset.project_id == project.id)
    if nameSearch:
        query = query.where(Dataset.name.ilike(f"%{_escape_like(nameSearch)}%", escape="\\"))
    rows, cursor = page.cut(session.scalars(page.apply(query, Dataset.pk)).all(), lambda d: d.pk)
    return s.ListDatasetsResponse(data=[dataset_info(d) for d in rows], nextCursor=cursor)


@router.get("/beta/dataset/{dataset_id}", response_model=s.DatasetInfo,
            summary="Get dataset info", operation_id="get_dataset")
def get_dataset(dataset_id: Name = DatasetId, who: Caller = Depends(caller),
                session: Session = Depends(db, scope="function")):
    return dataset_info(team_dataset(session, who, dataset_id))


@router.delete("/beta/dataset/{dataset_id}", response_model=dict, summary="Delete dataset",
               operation_id="delete_dataset")
def delete_dataset(dataset_id: Name = DatasetId, who: Caller = Depends(caller),
                   session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    session.execute(delete(Dataset).where(Dataset.pk == dataset.pk))
    return {}


def _version_info(version: Version) -> s.VersionInfo:
    return s.VersionInfo(id=version.id, comment=version.comment, createdAt=version.created_at)


@router.post("/beta/dataset/{dataset_id}/version", response_model=s.VersionInfo,
             summary="Create a version", operation_id="create_version")
def create_version(dataset_id: Name = DatasetId, comment: Text = Query(...),
                   who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    version = Version(id=new_id("ver"), dataset_pk=dataset.pk, comment=comment,
                      created_at=now_s())
    session.add(version)
    session.flush()
    for split in session.scalars(select(Split).where(Split.dataset_pk == dataset.pk)):
        frozen = VersionSplit(version_pk=version.pk, split_id=split.id, name=split.name,
                              created_at=split.created_at, updated_at=split.updated_at)
        session.add(frozen)
        session.flush()
        session.execute(insert(VersionSample).from_select(
            ["version_split_pk", "sample_id", "data"],
            select(literal(frozen.pk), Sample.id, Sample.data).where(Sample.split_pk == split.pk)))
    return _version_info(version)


@router.get("/beta/dataset/{dataset_id}/version", response_model=s.ListVersionsResponse,
            summary="List versions", operation_id="list_versions")
def list_versions(dataset_id: Name = DatasetId, who: Caller = Depends(caller),
                  session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    versions = session.scalars(select(Version).where(Version.dataset_pk == dataset.pk)
                               .order_by(Version.pk))
    return s.ListVersionsResponse(versions=[_version_info(v) for v in versions])


@router.get("/beta/dataset/{dataset_id}/version/{version_id}", response_model=s.VersionInfo,
            summary="Get version info", operation_id="get_version")
def get_version(dataset_id: Name = DatasetId,
                version_id: Name = Path(description="ID of the version to get."),
                who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    return _version_info(dataset_version(session, dataset, version_id, ("path", "version_id")))


@router.delete("/beta/dataset/{dataset_id}/version/{version_id}", response_model=dict,
               summary="Delete a version", operation_id="delete_version")
def delete_version(dataset_id: Name = DatasetId,
                   version_id: Name = Path(description="ID of the version to delete."),
                   who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    dataset = team_dataset(session, who, dataset_id)
    version = dataset_version(session, dataset, version_id, ("path", "version_id"))
    session.execute(delete(Version).where(Version.pk == version.pk))
    return {}
