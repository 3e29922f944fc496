"""A LoRA adapter's route as an engine client: what `ServerState.resolve_model`
returns for a `model` that names an adapter.

It is the base engine, except that every request it validates computes with the
adapter (`SamplingParams.adapter`), so the generation routes serve adapters
without knowing about them.
"""

import dataclasses

from amity.engine.client import EngineClient
from amity.engine.sampling_params import SamplingParams


class AdapterRoute:
    def __init__(self, engine: EngineClient, route: str):
        self._engine = engine
        self.route = route

    def __getattr__(self, name: str):
        # Everything but `validate` is the base engine's own (model facts, streams, abort).
        return getattr(self._engine, name)

    async def validate(self, prompt_token_ids: list[int], params: SamplingParams, **kwargs) -> object:
        return await self._engine.validate(prompt_token_ids, dataclasses.replace(params, adapter=self.route),
                                           **kwargs)
