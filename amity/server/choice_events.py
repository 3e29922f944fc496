"""The engine's deltas, split per choice into reasoning, content and tool calls: the
one stream that chat and messages, streaming or not, are all built from."""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from amity.engine.outputs import TokenLogprob
from amity.server.chat_output import ChoiceParser, Pieces
from amity.server.generation import Generation


@dataclass
class ChoiceEvent:
    index: int
    pieces: Pieces
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None  # "tool_calls" when the parser found calls and nothing cut them
    token_ids: list[int]
    stop_reason: str | tuple[int, ...] | None  # the stop the engine matched (CompletionOutput)


async def choice_events(gen: Generation, make_parser: Callable[[], ChoiceParser]
                        ) -> AsyncIterator[ChoiceEvent]:
    parsers: dict[int, ChoiceParser] = {}
    async for index, out in gen.outputs():
        parser = parsers.get(index) or parsers.setdefault(index, make_parser())
        pieces = parser.feed(out.new_text)
        finish = out.finish_reason
        if finish is not None:
            pieces = pieces + parser.finish()
            if parser.made_tool_calls and finish == "stop":  # cut by a limit: still "length"
                finish = "tool_calls"
        yield ChoiceEvent(index, pieces, out.new_logprobs, finish, out.new_token_ids, out.stop_reason)
