"""Wire models of the dedicated endpoint API, as the spec names them (camelCase
bodies, snake_case `advanced`). Responses carry the endpoint id as an extra `id`
(`DedicatedEndpointStatus` has none in the spec; clients ignore extras)."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from amity.suite.wire import Name, Text

Status = Literal["UNKNOWN", "INITIALIZING", "RUNNING", "UPDATING", "SLEEPING", "AWAKING", "FAILED",
                 "STOPPING", "TERMINATING", "TERMINATED", "READY"]
Phase = Literal["REQUESTING_VIRTUAL_MACHINE", "DOWNLOADING_MODEL", "ENGINE_INITIALIZING"]
ErrorCode = Literal[
    "WORKLOAD_INIT_UNKNOWN_ERROR", "WORKLOAD_INIT_SETTINGS_ERROR", "WORKLOAD_INIT_GRPC_ERROR",
    "WORKLOAD_INIT_MANIFEST_NOT_FOUND_ERROR", "WORKLOAD_INIT_MANIFEST_TYPE_ERROR",
    "WORKLOAD_INIT_DOWNLOAD_ERROR", "WORKLOAD_INIT_INVALID_TOKEN_ERROR",
    "WORKLOAD_INIT_CANNOT_ACCESS_REPO_ERROR", "WORKLOAD_INIT_HF_WANDB_API_ERROR",
    "WORKLOAD_INIT_INSUFFICIENT_DISK_ERROR", "INFERENCE_ENGINE_UNKNOWN_ERROR",
    "INFERENCE_ENGINE_INVALID_ARGUMENT_ERROR", "INFERENCE_ENGINE_MEMORY_ERROR",
    "INFERENCE_ENGINE_METERING_CLIENT_CONFIG_ERROR"]


class EndpointAdvancedConfig(BaseModel):
    max_batch_size: int | None = Field(None, ge=1, le=4096)
    tokenizer_skip_special_tokens: bool
    tokenizer_add_special_tokens: bool
    max_token_count: int = Field(2560, ge=16, le=1_048_576)
    enable_content_logging: bool | None = None
    max_input_length: int | None = Field(None, ge=1, le=1_048_576)


class EndpointSimplescaleConfig(BaseModel):
    replicas: int = Field(ge=1, le=10)


class AutoscalingPolicy(BaseModel):
    minReplica: int = Field(0, ge=0, le=10)
    maxReplica: int = Field(1, ge=1, le=10)
    cooldownPeriod: int = Field(300, ge=0, le=86_400)

    @model_validator(mode="after")
    def _ordered(self):
        if self.minReplica > self.maxReplica:
            raise ValueError("minReplica must not exceed maxReplica")
        return self


def _one_scaling(body):
    if body.simplescale is not None and body.autoscalingPolicy is not None:
        raise ValueError("send `simplescale` or `autoscalingPolicy`, not both")
    return body


class DedicatedEndpointCreateBody(BaseModel):
    projectId: Name
    name: Name
    instanceOptionId: Name
    advanced: EndpointAdvancedConfig
    simplescale: EndpointSimplescaleConfig | None = None
    autoscalingPolicy: AutoscalingPolicy | None = None
    hfModelRepo: Name
    hfModelRepoRevision: Name | None = None
    initialVersionComment: Text | None = None

    _check = model_validator(mode="after")(_one_scaling)


class DedicatedEndpointUpdateBody(BaseModel):
    name: Name | None = None
    advanced: EndpointAdvancedConfig | None = None
    simplescale: EndpointSimplescaleConfig | None = None
    autoscalingPolicy: AutoscalingPolicy | None = None
    hfModelRepo: Name | None = None
    hfModelRepoRevision: Name | None = None
    newVersionComment: Text | None = None
    instanceOptionId: Name | None = None

    _check = model_validator(mode="after")(_one_scaling)


class DedicatedEndpointStatus(BaseModel):
    id: str
    status: Status
    errorCode: ErrorCode | None = None
    createdAt: datetime
    updatedAt: datetime | None = None
    phase: Phase | None = None


class DedicatedEndpointSpec(BaseModel):
    id: str
    name: str
    gpuType: str
    numGpu: int
    instanceId: str | None = None
    projectId: str
    creatorId: str
    teamId: str
    autoscalingMin: int
    autoscalingMax: int
    autoscalingCooldown: int
    maxBatchSize: int
    maxInputLength: int | None = None
    tokenizerSkipSpecialTokens: bool
    tokenizerAddSpecialTokens: bool
    currReplicaCnt: int | None = None
    desiredReplicaCnt: int | None = None
    updatedReplicaCnt: int | None = None
    # amity's extras: what the spec does not echo
    hfModelRepo: str | None = None
    versionComment: str | None = None
    createdAt: datetime | None = None


class DedicatedEndpointListResponse(BaseModel):
    data: dict[str, DedicatedEndpointStatus] = {}
    nextCursor: str | None = None


class DedicatedEndpointVersionHistoryResponse(BaseModel):
    data: dict[str, DedicatedEndpointSpec] = {}
    nextCursor: str | None = None


class AcceleratorRequirement(BaseModel):
    type: Name
    count: int = Field(ge=1, le=8)


class DedicatedEndpointWandbArtifactCreateBody(BaseModel):
    wandbArtifactVersionName: Name
    accelerator: AcceleratorRequirement | None = None
    name: Name | None = None
    projectId: Name | None = None
    idempotencyKey: Name | None = None
    autoscalingPolicy: AutoscalingPolicy | None = None


class DedicatedEndpointWandbArtifactCreateResponse(BaseModel):
    endpointId: str
    endpointName: str
    projectId: str
    projectName: str
    teamId: str
    teamName: str | None = None
