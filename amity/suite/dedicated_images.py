"""The dedicated image operations' shapes on top of the container's.

The spec's dedicated body takes `response_format` in url (its default), raw, png, jpeg,
jpg and answers `{"data": [{seed, response_format, b64_json | url}]}`; the container
(amity's replica) takes jpeg or raw (lossless PNG) and answers `{"image", "seed"}`. The
router maps the request's format onto the container's and the container's answer back.
`url` is a `data:` URL holding the JPEG: the Suite keeps no image store to link to.
A format outside the spec's goes to the replica as sent, which refuses it (422).
"""

import json

IMAGE_PATHS = ("/v1/images/generations", "/v1/images/edits")
# The spec's format -> (the container's format, the MIME type of what it returns).
FORMATS = {"url": ("jpeg", "image/jpeg"), "jpeg": ("jpeg", "image/jpeg"),
           "jpg": ("jpeg", "image/jpeg"), "png": ("raw", "image/png"), "raw": ("raw", "image/png")}
DEFAULT_FORMAT = "url"


def to_container(body: dict) -> tuple[bytes, str]:
    """(the container's body, the format the client asked for) of a dedicated body."""
    asked = body.get("response_format") or DEFAULT_FORMAT
    if isinstance(asked, str) and asked in FORMATS:
        body = {**body, "response_format": FORMATS[asked][0]}
    return json.dumps(body, ensure_ascii=False).encode(), asked


def answer_rewriter(asked: str):
    """The rewrite of a successful container answer into the dedicated one."""
    def rewrite(answer: bytes) -> bytes:
        result = json.loads(answer)
        item = {"seed": result["seed"], "response_format": asked}
        if asked == "url":
            item["url"] = f"data:{FORMATS[asked][1]};base64,{result['image']}"
        else:
            item["b64_json"] = result["image"]
        return json.dumps({"data": [item]}).encode()
    return rewrite
