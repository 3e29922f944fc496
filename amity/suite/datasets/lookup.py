"""Finding a dataset, split or version as the caller's team sees them: anything that is
not there, or belongs to another team, is the same 404."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from amity.suite.auth import Caller
from amity.suite.datasets import schemas as s
from amity.suite.errors import not_found
from amity.suite.store.models import Dataset, Project, Split, Version


def team_dataset(session: Session, who: Caller, dataset_id: str) -> Dataset:
    dataset = session.scalar(select(Dataset).join(Project, Dataset.project_id == Project.id).where(
        Dataset.id == dataset_id, Project.team_id == who.team_id))
    if dataset is None:
        raise not_found("dataset", dataset_id, ("path", "dataset_id"))
    return dataset


def dataset_split(session: Session, dataset: Dataset, split_id: str) -> Split:
    split = session.scalar(select(Split).where(Split.id == split_id,
                                               Split.dataset_pk == dataset.pk))
    if split is None:
        raise not_found("split", split_id, ("path", "split_id"))
    return split


def dataset_version(session: Session, dataset: Dataset, version_id: str, loc) -> Version:
    version = session.scalar(select(Version).where(Version.id == version_id,
                                                   Version.dataset_pk == dataset.pk))
    if version is None:
        raise not_found("version", version_id, loc)
    return version


def dataset_info(dataset: Dataset) -> s.DatasetInfo:
    return s.DatasetInfo(id=dataset.id, name=dataset.name, createdAt=dataset.created_at,
                         updatedAt=dataset.updated_at,
                         modality=s.DedicatedDatasetModality(**dataset.modality))
