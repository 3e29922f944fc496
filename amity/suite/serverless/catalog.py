"""The serverless model catalog: a TOML file (`--catalog`; the built-in catalog.toml
by default), checked when the Suite starts so that a bad entry is an error at once,
not a 500 on `GET /serverless/v1/models`."""

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amity.suite.serverless.schemas import Functionality, ModelCatalogItem, Pricing

BUILT_IN = Path(__file__).with_name("catalog.toml")


class PricingEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    input_cache_read: float | None = Field(default=None, ge=0)
    response_time: float = Field(default=0, ge=0)
    audio_minute: float | None = Field(default=None, ge=0)
    unit_type: str = "TOKEN"


class CatalogEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    description: str
    source: str = Field(min_length=1)
    replicas: str = Field(default="always-on", pattern="^(always-on|scale-to-zero)$")
    max_completion_tokens: int = Field(ge=1)
    context_length: int = Field(ge=1)
    hugging_face_url: str = Field(min_length=1)
    license: str = Field(min_length=1)
    policy: str | None = None
    created: int
    deprecation_date: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    functionality: Functionality
    pricing: PricingEntry

    def item(self) -> ModelCatalogItem:
        p = self.pricing
        return ModelCatalogItem(
            id=self.id, name=self.name, max_completion_tokens=self.max_completion_tokens,
            context_length=self.context_length, functionality=self.functionality,
            pricing=Pricing(input=p.input, output=p.output, prompt=p.input, completion=p.output,
                            input_cache_read=p.input_cache_read, response_time=p.response_time,
                            audio_minute=p.audio_minute, unit_type=p.unit_type),
            hugging_face_url=self.hugging_face_url, description=self.description,
            license=self.license, policy=self.policy, created=self.created,
            deprecation_date=self.deprecation_date)


class Catalog:
    def __init__(self, entries: list[CatalogEntry]):
        self.entries = {e.id: e for e in entries}
        if len(self.entries) != len(entries):
            raise ValueError("the catalog lists a model id twice")

    def get(self, model_id: str) -> CatalogEntry | None:
        return self.entries.get(model_id)


def load_catalog(path: str | None) -> Catalog:
    source = Path(path) if path else BUILT_IN
    try:
        data = tomllib.loads(source.read_text())
        return Catalog([CatalogEntry.model_validate(m) for m in data.get("models", [])])
    except (OSError, tomllib.TOMLDecodeError, ValidationError, ValueError) as error:
        raise ValueError(f"cannot read the model catalog {source}: {error}") from None
