"""A LoRA adapter's route as an engine client: what `ServerState.resolve_model`
returns for a `model` that names an adapter.

It is the base engine, except that every request it validates computes with the
adapter (`SamplingParams.adapter`, `PoolingParams.adapter`), so the generation and
pooling routes serve adapters without knowing about them.
"""

import dataclasses

from amity.engine.client import EngineClient
from amity.engine.pooling_params import PoolingParams, ValidatedPooling
from amity.engine.sampling_params import SamplingParams


class AdapterRoute:
    def __init__(self, engine: EngineClient, route: str):
        self._engine = engine
        self.route = route

    def __getattr__(self, name: str):
        # Everything but validation is the base engine's own (model facts, streams, abort).
        return getattr(self._engine, name)

    async def validate(self, prompt_token_ids: list[int], params: SamplingParams, **kwargs) -> object:
        return await self._engine.validate(prompt_token_ids, dataclasses.replace(params, adapter=self.route),
                                           **kwargs)

    def validate_pooling(self, prompt_token_ids: list[int], params: PoolingParams) -> ValidatedPooling:
        return self._engine.validate_pooling(prompt_token_ids, dataclasses.replace(params, adapter=self.route))
