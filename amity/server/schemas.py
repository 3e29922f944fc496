"""The wire models of the Friendli Container API, from the flat OpenAPI file in shared/spec.

Requests are validated here for shape and type only. Value ranges live in one place,
`SamplingParams._validate`, which the translation step in `protocol.py` turns into the
same 422 shape, so a range is never checked (or worded) twice. Every optional request
field is nullable in the spec; `None` always means "the default".

Unknown request fields are ignored, as OpenAI-compatible servers (vLLM) do, so that
clients sending newer fields keep working. Every float field of every request is finite:
JSON has no NaN or Infinity, but Python's parser (FastAPI's) reads those literals and
turns 1e400 into inf, so `RequestModel` refuses non-finite numbers once, for all fields
and nested containers (`logit_bias` values, `embedding_to_replace` items).
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ResponseModel(BaseModel):
    # Responses may carry fields the spec leaves open (e.g. `reasoning_content`).
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- shared request parts

# A token id is an integer, never a boolean or a numeric string coerced into one.
TokenId = Annotated[int, Strict()]


class TokenSequence(RequestModel):
    tokens: list[TokenId] | None = None


class StreamOptions(RequestModel):
    include_usage: bool | None = None


class ResponseFormatText(RequestModel):
    type: Literal["text"]


class ResponseFormatJsonObject(RequestModel):
    type: Literal["json_object"]


class JsonSchemaSpec(RequestModel):
    model_config = ConfigDict(extra="allow")
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormatJsonSchema(RequestModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class ResponseFormatRegex(RequestModel):
    type: Literal["regex"]
    schema_: str = Field(alias="schema")


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema | ResponseFormatRegex,
    Field(discriminator="type"),
]


class GenerationFields(RequestModel):
    """The generation controls that completions and chat share, with the spec's names."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: list[int] | int | None = None
    stop: list[str] | None = None
    eos_token: list[TokenId] | None = None
    response_format: ResponseFormat | None = None


# ---------------------------------------------------------------- /v1/completions


class CompletionsBody(GenerationFields):
    """`CompletionsBodyWithPrompt | CompletionsBodyWithTokens` as one model: exactly one of
    `prompt` and `tokens` (checked below, so the error names the field to change)."""

    prompt: str | list[str] | None = None
    tokens: list[TokenId] | None = None
    bad_words: list[str] | None = None
    bad_word_tokens: list[TokenSequence] | None = None
    stop_tokens: list[TokenSequence] | None = None
    logprobs: int | None = None
    max_total_tokens: int | None = None
    min_total_tokens: int | None = None
    no_repeat_ngram: int | None = None
    encoder_no_repeat_ngram: int | None = None
    encoder_repetition_penalty: float | None = None
    forced_output_tokens: list[TokenId] | None = None
    embedding_to_replace: list[float] | None = None
    token_index_to_replace: list[TokenId] | None = None

    @model_validator(mode="after")
    def _prompt_xor_tokens(self):
        if self.prompt is None and self.tokens is None:
            raise ValueError("give either `prompt` (text) or `tokens` (token ids)")
        if self.prompt is not None and self.tokens is not None:
            raise ValueError("give only one of `prompt` and `tokens`, not both")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("`prompt` is an empty list; give at least one prompt")
        return self


class CompletionsLogprobs(ResponseModel):
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class PromptTokensDetails(ResponseModel):
    cached_tokens: int | None = None


class Usage(ResponseModel):
    """`TextUsage` and `ChatUsage`: the same fields."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionsChoice(ResponseModel):
    index: int
    text: str
    tokens: list[int]
    seed: int
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionsLogprobs | None = None


class CompletionsSuccess(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    model: str | None = None
    choices: list[CompletionsChoice]
    usage: Usage


class StreamedCompletionsChoice(ResponseModel):
    index: int
    text: str
    token: int | None = None
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: CompletionsLogprobs | None = None


class StreamedCompletionData(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    model: str | None = None
    created: int
    choices: list[StreamedCompletionsChoice]
    usage: Usage | None = None


# ---------------------------------------------------------------- /v1/chat/completions


class TextContent(RequestModel):
    type: Literal["text"]
    text: str


class MediaUrl(RequestModel):
    url: str


class ImageContent(RequestModel):
    type: Literal["image_url"]
    image_url: MediaUrl


class AudioContent(RequestModel):
    type: Literal["audio_url"]
    audio_url: MediaUrl


class VideoContent(RequestModel):
    type: Literal["video_url"]
    video_url: MediaUrl


ContentPart = Annotated[
    TextContent | ImageContent | AudioContent | VideoContent, Field(discriminator="type")
]


class FunctionCall(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(RequestModel):
    role: Literal["system"]
    # The spec says string; OpenAI also takes text parts here, so we do too.
    content: str | list[TextContent]
    name: str | None = None


class UserMessage(RequestModel):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: str | None = None


class AssistantMessage(RequestModel):
    role: Literal["assistant"]
    content: str | list[TextContent] | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(RequestModel):
    role: Literal["tool"]
    content: str | list[TextContent]
    tool_call_id: str
    name: str | None = None


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDefinition(RequestModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunctionName(RequestModel):
    name: str


class ToolChoiceFunction(RequestModel):
    type: Literal["function"]
    function: ToolChoiceFunctionName


class ChatMessagesFields(RequestModel):
    """What a chat template renders: shared by chat completions and /v1/chat/render."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ChatCompletionBody(GenerationFields, ChatMessagesFields):
    # OpenAI's newer name for max_tokens; the openai SDK sends it when asked to.
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    parse_reasoning: bool | None = None
    include_reasoning: bool | None = None
    # Both reach the chat template as variables of these names (chat_prompt.template_kwargs).
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    reasoning_budget: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _consistent(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give only one of `max_tokens` and `max_completion_tokens`")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("`top_logprobs` needs `logprobs: true`")
        return self


class ChatRenderBody(ChatMessagesFields):
    pass


class ChatRenderSuccess(ResponseModel):
    text: str


class FunctionResult(ResponseModel):
    name: str
    arguments: str


class ToolCallResult(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionResult


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobsContent(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[ChatLogprobsContent] | None = None


class ChatChoiceMessage(ResponseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallResult] | None = None


class ChatChoice(ResponseModel):
    index: int
    message: ChatChoiceMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None = None


class ChatCompleteSuccess(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    model: str | None = None
    created: int
    choices: list[ChatChoice]
    usage: Usage


class StreamedFunctionResult(ResponseModel):
    name: str | None = None
    arguments: str


class StreamedToolCallResult(ResponseModel):
    index: int
    id: str | None = None
    type: Literal["function"] = "function"
    function: StreamedFunctionResult


class StreamedChatChoiceDelta(ResponseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[StreamedToolCallResult] | None = None


class StreamedChatChoice(ResponseModel):
    index: int
    delta: StreamedChatChoiceDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChatLogprobs | None = None


class StreamedChatData(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    model: str | None = None
    created: int
    choices: list[StreamedChatChoice]
    usage: Usage | None = None


# ---------------------------------------------------------------- tokens, models, errors


class TokenizationBody(RequestModel):
    model: str | None = None
    prompt: str


class TokenizationSuccess(ResponseModel):
    tokens: list[int]


class DetokenizationBody(RequestModel):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizationSuccess(ResponseModel):
    text: str


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "amity"
    max_model_len: int | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ValidationErrorItem(ResponseModel):
    loc: list[str | int]
    msg: str
    type: str


class HTTPValidationError(ResponseModel):
    detail: list[ValidationErrorItem]


class MessagesErrorObject(ResponseModel):
    type: str
    message: str


class MessagesErrorResponse(ResponseModel):
    type: Literal["error"] = "error"
    error: MessagesErrorObject
    request_id: str | None = None
