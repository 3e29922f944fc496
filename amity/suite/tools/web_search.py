"""`web:search` and `linkup:search`: web search through a backend the operator
configures. `web:search` asks a SearXNG instance (`--web-search-url`, its JSON API:
`GET /search?q=...&format=json`); `linkup:search` asks Linkup's API (`--linkup-api-key`
or LINKUP_API_KEY; `POST /search`). Unconfigured, a call is ERRORED and says which
flag to set: nothing is made up. The backends are the operator's own choice, so the
web:url address rules do not apply to them."""

import httpx

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput, string_arg

MAX_RESULTS = 5
MAX_SNIPPET_CHARS = 1_000
TIMEOUT_S = 15.0


def _hits(items: list, title_key: str) -> list[dict]:
    hits = []
    for item in items[:MAX_RESULTS]:
        if isinstance(item, dict):
            hits.append({"title": str(item.get(title_key) or ""), "url": str(item.get("url") or ""),
                         "snippet": str(item.get("content") or "")[:MAX_SNIPPET_CHARS]})
    return hits


def _get_json(response_call) -> dict:
    try:
        response = response_call()
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise ToolError("search_failed", f"the search backend failed: {error}") from None


def searxng(query: str, base_url: str) -> list[dict]:
    body = _get_json(lambda: httpx.get(f"{base_url.rstrip('/')}/search",
                                       params={"q": query, "format": "json"}, timeout=TIMEOUT_S))
    return _hits(body.get("results") or [], "title")


def linkup(query: str, base_url: str, api_key: str) -> list[dict]:
    body = _get_json(lambda: httpx.post(
        f"{base_url.rstrip('/')}/search", headers={"Authorization": f"Bearer {api_key}"},
        json={"q": query, "depth": "standard", "outputType": "searchResults"}, timeout=TIMEOUT_S))
    return _hits(body.get("results") or [], "name")


def run_web_search(args: dict, context: ToolContext) -> ToolOutput:
    query = string_arg(args, "query", 500)
    if not context.settings.searxng_url:
        raise ToolError("not_configured", "web:search has no search backend: start the Suite "
                                          "with --web-search-url (a SearXNG instance)")
    return ToolOutput({"query": query, "results": searxng(query, context.settings.searxng_url)})


def run_linkup(args: dict, context: ToolContext) -> ToolOutput:
    query = string_arg(args, "query", 500)
    settings = context.settings
    if not settings.linkup_api_key:
        raise ToolError("not_configured", "linkup:search is not configured: start the Suite with "
                                          "--linkup-api-key or set LINKUP_API_KEY")
    return ToolOutput({"query": query, "results": linkup(query, settings.linkup_url,
                                                         settings.linkup_api_key)})


PARAMETERS = {"type": "object", "properties": {
    "query": {"type": "string", "description": "What to search the web for."}},
    "required": ["query"]}
WEB_SEARCH = BuiltinTool(type="web:search", description="Search the web; returns titles, URLs "
                         "and snippets of the top results.", parameters=PARAMETERS,
                         run=run_web_search)
LINKUP_SEARCH = BuiltinTool(type="linkup:search", description="Search the web with Linkup; "
                            "returns titles, URLs and snippets of the top results.",
                            parameters=PARAMETERS, run=run_linkup)
