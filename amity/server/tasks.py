"""Which routes a model serves, by its task: one table for the whole server.

A route in the table answers only for a model of its task; any other model gets a
400 that names the model's task and the routes it does serve, as vLLM answers. Routes
not in the table (/v1/tokenize, /v1/models, /health, /metrics) serve every model. An
image model (amity/images) is served by an image service, not an engine:
`ServerState.ready_engine` and `resolve_images` refuse the wrong routes for it.
"""

from fastapi import Request

from amity.server.errors import ApiError
from amity.server.state import state_of

ROUTES_OF_TASK: dict[str, tuple[str, ...]] = {
    "generate": ("/v1/completions", "/v1/chat/completions", "/v1/messages"),
    "embed": ("/v1/embeddings",),
    "classify": ("/classify",),
    "transcribe": ("/v1/audio/transcriptions",),
}
TASK_OF_ROUTE = {path: task for task, paths in ROUTES_OF_TASK.items() for path in paths}


async def require_task(request: Request) -> None:
    """A FastAPI dependency of every route: refuses a route the model's task does not serve."""
    route = request.scope.get("route")
    needed = TASK_OF_ROUTE.get(getattr(route, "path", None))
    if needed is None:
        return
    state = state_of(request)
    task = state.ready_engine().task
    if task != needed:
        raise ApiError(400, f"{route.path} serves {needed} models; {state.model_name!r} is a {task} "
                            f"model, which serves {', '.join(ROUTES_OF_TASK[task])}",
                       loc=("body", "model"), type="wrong_task")
