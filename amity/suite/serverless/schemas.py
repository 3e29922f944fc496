"""Wire models of the serverless operations (the spec's ModelCatalogResponseItem,
ServerlessToolAssistedChatCompletionBody and friends)."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from amity.suite.wire import Name


class Functionality(BaseModel):
    tool_call: bool
    builtin_tool: bool
    parallel_tool_call: bool
    structured_output: bool = True


class Pricing(BaseModel):
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)
    input_cache_read: float | None = None
    response_time: float = 0
    audio_minute: float | None = None
    unit_type: Literal["TOKEN", "SECOND", "AUDIO_MINUTE"] = "TOKEN"


class ModelCatalogItem(BaseModel):
    id: str
    name: str
    max_completion_tokens: int
    context_length: int
    functionality: Functionality
    pricing: Pricing
    hugging_face_url: str
    description: str
    license: str
    policy: str | None  # required (nullable) in our flat spec and in SDK 0.12.x
    created: int
    deprecation_date: str | None = None


class ServerlessModelListSuccess(BaseModel):
    data: list[ModelCatalogItem]


FriendliToolName = Literal["math:calculator", "math:statistics", "math:calendar", "web:search",
                           "web:url", "code:python-interpreter"]


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


class FriendliBuiltInTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: FriendliToolName


class IntegratedBuiltInTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["linkup:search"]


class FileBuiltInTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["file:text"]
    # "only one file" (the spec): more is a 422.
    files: list[Name] = Field(min_length=1, max_length=1)


ToolAssistedChatTool = Annotated[FunctionTool | FriendliBuiltInTool | IntegratedBuiltInTool
                                 | FileBuiltInTool, Field(discriminator="type")]


class ToolChoiceFunctionName(BaseModel):
    name: str


class ToolChoiceFunction(BaseModel):
    type: Literal["function"]
    function: ToolChoiceFunctionName


class StreamOptions(BaseModel):
    include_usage: bool | None = None


# Fields the container's chat takes as they are; the container checks their values.
PASSED_THROUGH = ("chat_template_kwargs", "eos_token", "frequency_penalty", "logit_bias",
                  "logprobs", "max_tokens", "min_p", "parallel_tool_calls", "presence_penalty",
                  "repetition_penalty", "reasoning_effort", "reasoning_budget", "seed", "stop",
                  "parse_reasoning", "include_reasoning", "temperature", "top_k", "top_logprobs",
                  "top_p", "xtc_threshold", "xtc_probability")
REFUSED = ("min_tokens", "response_format")


class ToolAssistedChatBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Name
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[ToolAssistedChatTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    resume_generation: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=1)  # one answer: the tool loop is per answer
    chat_template_kwargs: dict[str, Any] | None = None
    eos_token: list[int] | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    max_tokens: int | None = None
    min_p: float | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    reasoning_effort: str | None = None
    reasoning_budget: int | None = None
    seed: int | list[int] | None = None
    stop: list[str] | None = None
    parse_reasoning: bool | None = None
    include_reasoning: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data):
        if isinstance(data, dict):
            for name in REFUSED:
                if name in data:
                    raise ValueError(f"`{name}` is not supported by tool-assisted chat; drop it")
        return data

    def passed_through(self) -> dict:
        return {k: getattr(self, k) for k in PASSED_THROUGH if getattr(self, k) is not None}
