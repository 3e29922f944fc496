"""The default object store: a directory under the data directory, behind URLs the
Suite signs (HMAC) and serves itself (`transfer.py`).

Upload policy, like S3's presigned POST: the form carries `key`, a base64 `policy`
(key, largest size, expiry) and `x-amz-signature` over the policy. A bad signature, an
expired policy or a key other than the policy's is a 403; more bytes than the policy
allows a 400 as soon as they arrive. The bytes go to `incoming/` while sha256 and the
size are computed, then move into place with a small `.meta` record of both.
"""

import base64
import binascii
import hashlib
import json
import math
import os
import secrets
import shutil
import time
from pathlib import Path

from amity.suite.errors import ApiError
from amity.suite.files.objects import KEY_PATTERN, ObjectStat, UploadForm
from amity.suite.files.signing import Signer

ALGORITHM = "AMITY-HMAC-SHA256"


def _denied(msg: str) -> ApiError:
    return ApiError(403, msg, type="access_denied")


class Incoming:
    """A file part arriving: written to a temporary file, hashed and counted."""

    def __init__(self, path: Path, max_size: int):
        self.path, self.max_size = path, max_size
        self.size = 0
        self._hash = hashlib.sha256()
        self._file = open(path, "wb")  # noqa: SIM115 (closed in finish / discard)

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_size:
            raise ApiError(400, f"the upload is larger than the {self.max_size} bytes declared",
                           loc=("body", "file"), type="entity_too_large")
        self._hash.update(data)
        self._file.write(data)

    def finish(self) -> ObjectStat:
        self._file.close()
        return ObjectStat(self.size, self._hash.hexdigest())

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


class LocalStore:
    bucket = "amity-local"

    def __init__(self, root: Path, signer: Signer, public_url: str, url_ttl_s: int):
        self.root, self.signer, self.public_url, self.url_ttl_s = root, signer, public_url, url_ttl_s
        for sub in ("objects", "incoming"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not KEY_PATTERN.fullmatch(key):
            raise ApiError(404, "no such object", type="not_found")
        return self.root / "objects" / key

    def _expires(self) -> int:
        """Whole seconds, rounded up: a URL lives at least its TTL (truncated, a 1 s
        TTL could end at once)."""
        return math.ceil(time.time() + self.url_ttl_s)

    def upload_form(self, key: str, max_size: int) -> UploadForm:
        policy = base64.urlsafe_b64encode(json.dumps({
            "key": key, "max_size": max_size,
            "expires": self._expires()}).encode()).decode()
        return UploadForm(f"{self.public_url}/objects/upload", {
            "key": key, "policy": policy, "x-amz-algorithm": ALGORITHM,
            "x-amz-signature": self.signer.sign("upload", policy)})

    def accept(self, fields: dict) -> Incoming:
        """Check an upload form's policy (the fields before its file part) and open
        the file part's destination."""
        policy = fields.get("policy", "")
        if not self.signer.verify(fields.get("x-amz-signature", ""), "upload", policy):
            raise _denied("the upload policy's signature does not match")
        try:
            terms = json.loads(base64.urlsafe_b64decode(policy))
        except (binascii.Error, ValueError):
            raise _denied("the upload policy cannot be read") from None
        if time.time() > terms["expires"]:
            raise _denied("the upload policy has expired; ask for a new upload URL")
        if fields.get("key") != terms["key"]:
            raise _denied("the form's key is not the one the policy allows")
        if self._path(terms["key"]).exists():
            raise ApiError(409, "this object is uploaded already", type="conflict")
        return Incoming(self.root / "incoming" / secrets.token_hex(16), terms["max_size"])

    def store(self, key: str, incoming: Incoming) -> None:
        stat = incoming.finish()
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(incoming.path, path)
        Path(f"{path}.meta").write_text(json.dumps({"size": stat.size, "sha256": stat.sha256}))

    def put(self, key: str, data: bytes) -> ObjectStat:
        incoming = Incoming(self.root / "incoming" / secrets.token_hex(16), len(data))
        incoming.write(data)
        self.store(key, incoming)
        return ObjectStat(len(data), hashlib.sha256(data).hexdigest())

    def read(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)
        if path.stat().st_size > max_bytes:
            raise ValueError(f"the object is larger than {max_bytes} bytes")
        return path.read_bytes()

    def stat(self, key: str) -> ObjectStat | None:
        meta = Path(f"{self._path(key)}.meta")
        if not meta.exists():
            return None
        record = json.loads(meta.read_text())
        return ObjectStat(record["size"], record["sha256"])

    def download_url(self, key: str) -> str:
        expires = str(self._expires())
        signature = self.signer.sign("download", key, expires)
        return f"{self.public_url}/objects/{key}?expires={expires}&signature={signature}"

    def open_download(self, key: str, expires: str, signature: str) -> Path:
        if not self.signer.verify(signature, "download", key, expires):
            raise _denied("the download URL's signature does not match")
        if not expires.isdigit() or time.time() > int(expires):
            raise _denied("the download URL has expired; ask for a new one")
        path = self._path(key)
        if not path.exists():
            raise ApiError(404, "no such object", type="not_found")
        return path

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        Path(f"{path}.meta").unlink(missing_ok=True)

    def copy_to(self, key: str, dest: Path) -> None:
        # A hard link when the file system allows: model files are large.
        try:
            os.link(self._path(key), dest)
        except OSError:
            shutil.copyfile(self._path(key), dest)
