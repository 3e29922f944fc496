"""S3, or any S3-compatible store, through boto3: presigned POST uploads (with the size
limit as a `content-length-range` condition) and presigned GET downloads, both signed
by S3's own scheme. Endpoint and credentials come from the configuration and the usual
AWS environment (AWS_ACCESS_KEY_ID, AWS_DEFAULT_REGION, ...)."""

import hashlib
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

from amity.suite.files.objects import ObjectStat, UploadForm

CHUNK_BYTES = 1 << 20


class S3Store:
    def __init__(self, bucket: str, endpoint_url: str | None, url_ttl_s: int):
        self.bucket, self.url_ttl_s = bucket, url_ttl_s
        self.client = boto3.client("s3", endpoint_url=endpoint_url)
        try:
            self.client.head_bucket(Bucket=bucket)
        except ClientError as error:
            raise ValueError(f"cannot use S3 bucket {bucket!r}: {error}") from None

    def upload_form(self, key: str, max_size: int) -> UploadForm:
        post = self.client.generate_presigned_post(
            self.bucket, key, Conditions=[["content-length-range", 0, max_size]],
            ExpiresIn=self.url_ttl_s)
        return UploadForm(post["url"], post["fields"])

    def stat(self, key: str) -> ObjectStat | None:
        """Reads the object back to hash it: S3's ETag is not a sha256."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as error:
            if error.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None
            raise
        digest, size = hashlib.sha256(), 0
        for chunk in body.iter_chunks(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
        return ObjectStat(size, digest.hexdigest())

    def put(self, key: str, data: bytes) -> ObjectStat:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return ObjectStat(len(data), hashlib.sha256(data).hexdigest())

    def read(self, key: str, max_bytes: int) -> bytes:
        obj = self.client.get_object(Bucket=self.bucket, Key=key)
        if obj["ContentLength"] > max_bytes:
            raise ValueError(f"the object is larger than {max_bytes} bytes")
        return obj["Body"].read()

    def download_url(self, key: str) -> str:
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self.url_ttl_s)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def copy_to(self, key: str, dest: Path) -> None:
        self.client.download_file(self.bucket, key, str(dest))
