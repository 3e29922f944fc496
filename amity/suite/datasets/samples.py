"""What a sample is: a JSON object `{"messages": [...]}`, as the SDK builds them.

Each message's modalities are checked against the dataset's the way the SDK's own
`check_modality` does (system, assistant and tool messages and plain user strings
are TEXT; user content parts are TEXT, IMAGE, AUDIO or VIDEO; the output is TEXT),
so a client that skips the SDK's check still cannot store a sample its dataset does
not allow. Media may point at this Suite's own `s3://` objects, which must then be
uploaded files of the caller's team.
"""

import json
from typing import Callable

WORKING_COPY = "latest"  # the version part of the full id of a sample not in a version
ROLES = {"system", "user", "assistant", "tool"}
PART_MODALS = {"text": "TEXT", "image": "IMAGE", "image_url": "IMAGE", "audio_url": "AUDIO",
               "video_url": "VIDEO"}


def full_id(dataset_id: str, version_id: str | None, split_id: str, sample_id: int) -> str:
    return f"{dataset_id}:{version_id or WORKING_COPY}:{split_id}:{sample_id}"


def _media_urls(part: dict) -> list[str]:
    urls = []
    for field in ("image", "image_url", "audio_url", "video_url"):
        value = part.get(field)
        if isinstance(value, dict):
            value = value.get("url")
        if isinstance(value, str):
            urls.append(value)
    return urls


def _message_modals(message, where: str, check_media: Callable[[str], str | None]) -> set[str]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ValueError(f"{where}: a message is an object with `role` one of {sorted(ROLES)}")
    content = message.get("content")
    if message["role"] != "user":
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}: a {message['role']} message's `content` is a string")
        return {"TEXT"}
    if isinstance(content, str):
        return {"TEXT"}
    if not isinstance(content, list):
        raise ValueError(f"{where}: a user message's `content` is a string or a list of parts")
    modals = set()
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_MODALS:
            raise ValueError(f"{where}.content[{k}]: a part's `type` is one of {sorted(PART_MODALS)}")
        modals.add(PART_MODALS[kind])
        for url in _media_urls(part):
            problem = check_media(url)
            if problem:
                raise ValueError(f"{where}.content[{k}]: {problem}")
    return modals


def check_sample(text: str, modality: dict, check_media: Callable[[str], str | None]) -> str:
    """`text` if it is a valid sample for a dataset of `modality`; else ValueError
    saying why. `check_media(url)` returns a problem with a media URL, or None."""
    try:
        sample = json.loads(text)
    except ValueError:
        raise ValueError("a sample is a JSON object `{\"messages\": [...]}`; this is not JSON") from None
    if not isinstance(sample, dict) or not isinstance(sample.get("messages"), list):
        raise ValueError("a sample is a JSON object `{\"messages\": [...]}`")
    inputs = set()
    for i, message in enumerate(sample["messages"]):
        inputs |= _message_modals(message, f"messages[{i}]", check_media)
    for kind, used in (("input", inputs), ("output", {"TEXT"} if sample["messages"] else set())):
        allowed = set(modality.get(f"{kind}_modals", []))
        if not used <= allowed:
            raise ValueError(f"{kind} modality mismatch: the dataset allows {sorted(allowed)}, "
                             f"the sample uses {sorted(used)}")
    return text


def from_raw_row(row) -> str:
    """A row of an uploaded .jsonl file as a sample: a conversation as it is, or an
    Alpaca record (`instruction`, `input`?, `output`) as a user/assistant exchange,
    as Friendli's dataset guide describes."""
    if isinstance(row, dict) and "messages" in row:
        return json.dumps(row, separators=(",", ":"), ensure_ascii=False)
    if isinstance(row, dict) and isinstance(row.get("instruction"), str) and isinstance(
            row.get("output"), str):
        prompt = row["instruction"]
        if isinstance(row.get("input"), str) and row["input"]:
            prompt += "\n\n" + row["input"]
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": row["output"]}]
        return json.dumps({"messages": messages}, separators=(",", ":"), ensure_ascii=False)
    raise ValueError("a row is a conversation `{\"messages\": [...]}` or an Alpaca record "
                     "`{\"instruction\", \"input\"?, \"output\"}`")
