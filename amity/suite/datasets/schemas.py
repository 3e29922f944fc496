"""Wire models of the Datasets API, as the spec names them."""

from typing import Literal

from pydantic import BaseModel, Field

from amity.suite.wire import Name

Modal = Literal["VIDEO", "IMAGE", "AUDIO", "TEXT"]
SamplePair = tuple[str, str]  # (full sample id, sample JSON)


class DedicatedDatasetModality(BaseModel):
    input_modals: list[Modal] = Field(default=[], max_length=4)
    output_modals: list[Modal] = Field(default=[], max_length=4)


class CreateDatasetRequest(BaseModel):
    name: Name
    projectId: Name
    modality: DedicatedDatasetModality


class DatasetInfo(BaseModel):
    id: str
    name: str
    createdAt: int
    updatedAt: int
    modality: DedicatedDatasetModality


class ListDatasetsResponse(BaseModel):
    data: list[DatasetInfo]
    nextCursor: str | None = None


class VersionInfo(BaseModel):
    id: str
    comment: str
    createdAt: int


class ListVersionsResponse(BaseModel):
    versions: list[VersionInfo]


class SplitInfo(BaseModel):
    id: str
    name: str
    createdAt: int
    updatedAt: int


class ListSplitsResponse(BaseModel):
    data: list[SplitInfo]
    nextCursor: str | None = None


class AddSamplesResponse(BaseModel):
    samples: list[SamplePair]


class ListSamplesResponse(BaseModel):
    data: list[SamplePair]
    nextCursor: str | None = None


class DeleteSamplesResponse(BaseModel):
    sampleIds: list[str]
