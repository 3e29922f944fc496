"""Wire models of `POST /v1/messages` (the Anthropic Messages format), from the spec's
`ContainerMessagesBody`, `ContainerMessagesSuccess` and `MessagesStream*` schemas."""

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from amity.server.schemas import RequestModel, ResponseModel


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str


class ImageBlock(RequestModel):
    type: Literal["image"]
    source: dict[str, Any]


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: str | None = None
    name: str
    input: dict[str, Any]


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlock(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class CompatibilityBlock(RequestModel):
    """Blocks of Anthropic's server-side features; accepted and ignored, as the spec says."""

    type: Literal[
        "document", "search_result", "redacted_thinking", "server_tool_use",
        "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
        "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
        "tool_search_tool_result", "container_upload",
    ]


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | CompatibilityBlock,
    Field(discriminator="type"),
]


class InputMessage(RequestModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolDefinition(RequestModel):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _budget_with_enabled_only(self):
        # The spec: `enabled` requires a budget; `disabled` and `adaptive` must not have one.
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("`thinking` of type 'enabled' needs `budget_tokens`")
        if self.type != "enabled" and self.budget_tokens is not None:
            raise ValueError(f"`thinking` of type {self.type!r} takes no `budget_tokens`; "
                             "drop it or use type 'enabled'")
        return self


class OutputFormat(RequestModel):
    type: Literal["json_schema"] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(RequestModel):
    # Reaches the chat template as `reasoning_effort`, as chat's field of that name does.
    effort: Literal["low", "medium", "high", "max"] | None = None
    format: OutputFormat | None = None


class MessagesBody(RequestModel):
    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None
    # An extension, as in Friendli's chat body: the spec's Messages body allows additional
    # properties, and without a seed a sampled Messages request could never be reproduced.
    seed: int | None = None

    @model_validator(mode="after")
    def _budget_below_max_tokens(self):
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and self.max_tokens is not None and budget >= self.max_tokens:
            raise ValueError(f"`thinking.budget_tokens` ({budget}) must be below `max_tokens` "
                             f"({self.max_tokens})")
        return self


StopReason = Literal["end_turn", "max_tokens", "tool_use", "stop_sequence"]


class ResponseTextBlock(ResponseModel):
    type: Literal["text"] = "text"
    text: str


class ResponseThinkingBlock(ResponseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # we sign nothing; the spec requires the field


class ResponseToolUseBlock(ResponseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ResponseBlock = ResponseTextBlock | ResponseThinkingBlock | ResponseToolUseBlock


class MessagesUsage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class MessagesSuccess(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str | None = None
    content: list[ResponseBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessagesUsage
