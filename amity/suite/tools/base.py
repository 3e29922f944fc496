"""What every built-in tool is: a Friendli name (`math:calculator`), the function the
model is offered (a valid function name, a description, JSON-schema parameters) and a
`run` that turns the model's arguments into a JSON-able result, or raises ToolError.

Tools run in a worker thread (the loop's `asyncio.to_thread`); each bounds its own
work (sizes, time), so a hostile argument cannot hold the Suite.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from amity.config import SuiteConfig


class ToolError(Exception):
    """A call that cannot be answered: ERRORED with `error: {type, msg}`."""

    def __init__(self, type: str, msg: str):
        super().__init__(msg)
        self.type, self.msg = type, msg


@dataclass(frozen=True)
class OutputFile:
    name: str
    url: str


@dataclass
class ToolOutput:
    result: dict  # ENDED's `result` is its JSON text; the model reads the same text
    files: list[OutputFile] = field(default_factory=list)


class FileAccess(Protocol):
    """The caller's files in the Files store."""

    def read(self, file_id: str, max_bytes: int) -> tuple[str, bytes]:
        """(name, bytes) of an UPLOADED file of the caller's team; ToolError otherwise."""

    def save(self, name: str, data: bytes) -> OutputFile:
        """Store a file a tool made as a file of the caller's team; its download URL."""


@dataclass(frozen=True)
class ToolSettings:
    """The operator's choices for the tools (SuiteConfig's `--tool-*`, `--web-*` flags)."""

    web_allow: tuple[str, ...] = ()  # hosts, addresses or networks web:url may reach anyway
    searxng_url: str | None = None
    linkup_api_key: str | None = None
    linkup_url: str = "https://api.linkup.so/v1"
    interpreter_python: str = "/usr/bin/python3"
    interpreter_timeout_s: float = 20.0

    @classmethod
    def from_config(cls, config: SuiteConfig) -> "ToolSettings":
        allow = tuple(filter(None, (h.strip() for h in (config.web_url_allow or "").split(","))))
        return cls(web_allow=allow, searxng_url=config.web_search_url,
                   linkup_api_key=config.linkup_api_key or os.environ.get("LINKUP_API_KEY"),
                   interpreter_python=config.interpreter_python,
                   interpreter_timeout_s=config.interpreter_timeout_s)


@dataclass
class ToolContext:
    settings: ToolSettings
    files: FileAccess | None = None
    file_ids: list[str] = field(default_factory=list)  # file:text's `files` from the request


@dataclass(frozen=True)
class BuiltinTool:
    type: str  # Friendli's name, as the request and the tool_status events spell it
    description: str
    parameters: dict  # JSON schema of the arguments
    run: Callable[[dict, ToolContext], ToolOutput]

    @property
    def function_name(self) -> str:
        # Function names must match ^[a-zA-Z0-9_-]{1,64}$: `math:calculator` does not.
        return self.type.replace(":", "_").replace("-", "_")


def string_arg(args: dict, name: str, max_chars: int) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolError("invalid_arguments", f"`{name}` must be a non-empty string")
    if len(value) > max_chars:
        raise ToolError("invalid_arguments", f"`{name}` may be at most {max_chars} characters")
    return value


def text_output(fields: dict, text: str, max_chars: int) -> ToolOutput:
    """`fields` and `text`, cut to `max_chars` with a note saying so."""
    result = {**fields, "text": text[:max_chars]}
    if len(text) > max_chars:
        result["truncated"] = f"the first {max_chars} of {len(text)} characters"
    return ToolOutput(result)
