"""Wire models of the Files API, as the spec names them (camelCase, as the SDK reads)."""

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from amity.suite.wire import Name, Text

DIGEST_PATTERN = r"^[a-zA-Z0-9_+.-]+:[a-fA-F0-9]+$"


def _sha256_digest(value: str) -> str:
    algorithm, _, hex_digest = value.partition(":")
    if algorithm.lower() != "sha256":
        raise ValueError(f"only sha256 digests are accepted (`sha256:<hex>`), not {algorithm!r}")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", hex_digest):
        raise ValueError("a sha256 digest has 64 hex digits")
    return "sha256:" + hex_digest.lower()


class FileInitUploadRequest(BaseModel):
    name: Annotated[Text, Field(min_length=1, max_length=4096, description="Name of the file.")]
    size: int = Field(ge=0, description="Size of the file in bytes.")
    digest: Annotated[str, Field(pattern=DIGEST_PATTERN, max_length=200,
                                 description="`sha256:<hex>` of the file."),
                      AfterValidator(_sha256_digest)]
    projectId: Name


class FileInitUploadResponse(BaseModel):
    fileId: str
    uploadUrl: str | None = Field(description="None if the file is already uploaded.")
    aws: dict[str, str] | None = Field(description="Form fields to POST with the file.")


AccountFileStatus = Literal["UPLOADING", "UPLOADED", "FAILED", "DELETED"]


class FileInfo(BaseModel):
    id: str
    name: str
    size: int
    digest: str
    projectId: str
    creatorId: str
    createdAt: datetime
    expiresAt: datetime | None
    status: AccountFileStatus


class FileGetDownloadUrlResponse(BaseModel):
    fileId: str
    s3Uri: str
    downloadUrl: str
