"""Object stores: where the bytes of files live.

Both kinds speak S3's upload protocol, because that is what the SDK drives: the Files
API hands out a URL and the form fields of an S3 *presigned POST*, and the client
POSTs them with a `file` part, without the bearer token. Downloads are expiring
signed GET URLs. Keys are always ours (`<project id>/<file id>`).
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}/[A-Za-z0-9_-]{1,64}")


def object_key(project_id: str, file_id: str) -> str:
    key = f"{project_id}/{file_id}"
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"not an object key: {key!r}")
    return key


@dataclass(frozen=True)
class ObjectStat:
    size: int
    sha256: str  # hex


@dataclass(frozen=True)
class UploadForm:
    url: str
    fields: dict[str, str]


class ObjectStore(Protocol):
    bucket: str

    def upload_form(self, key: str, max_size: int) -> UploadForm:
        """Where and how to POST the bytes of `key` (at most `max_size` of them)."""

    def stat(self, key: str) -> ObjectStat | None:
        """Size and sha256 of the stored object; None when nothing was uploaded."""

    def download_url(self, key: str) -> str: ...

    def put(self, key: str, data: bytes) -> ObjectStat:
        """Store bytes the Suite made itself (a tool's output file)."""

    def read(self, key: str, max_bytes: int) -> bytes:
        """The stored bytes; a ValueError when there are more than `max_bytes`."""

    def delete(self, key: str) -> None: ...

    def copy_to(self, key: str, dest: Path) -> None:
        """Put the object's bytes at `dest` (a replica loads a model file from there)."""


def s3_uri(store: ObjectStore, key: str) -> str:
    return f"s3://{store.bucket}/{key}"
