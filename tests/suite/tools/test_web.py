"""web:url (readable text, SSRF refusal before and after redirects, caps) and the
search tools' backends (unconfigured: ERRORED with the flag to set)."""

import pytest

from amity.suite.tools import web_url
from amity.suite.tools.base import ToolContext, ToolError, ToolSettings
from amity.suite.tools.web_search import LINKUP_SEARCH, WEB_SEARCH
from tests.suite.tools.web_server import WebServer

LOCAL = ToolSettings(web_allow=("127.0.0.1",))


def fetch(url, settings=LOCAL):
    return web_url.TOOL.run({"url": url}, ToolContext(settings)).result


@pytest.fixture
def web():
    with WebServer() as server:
        yield server


def test_readable_text_of_a_page(web):
    page = fetch(f"{web.url}/page")
    assert page["title"] == "Otters of the river"
    assert page["text"] == "Otters\n\nOtters hold hands while they sleep.\n\nThey eat & play."
    assert fetch(f"{web.url}/plain")["text"] == "just text"
    assert web.seen[0][2]["Host"] == f"127.0.0.1:{web.port}"


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/page", "http://localhost:{port}/page", "http://[::1]:{port}/page",
    "http://[::ffff:127.0.0.1]:{port}/page", "http://2130706433:{port}/page",
    "http://0x7f.1:{port}/page", "http://0.0.0.0:{port}/page",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.1.1/",
    "http://172.16.0.1/", "http://[fe80::1]/", "http://100.64.0.1/", "http://224.0.0.1/",
])
def test_internal_addresses_are_refused_by_default(web, url):
    with pytest.raises(ToolError) as error:
        fetch(url.format(port=web.port), ToolSettings())
    assert error.value.type == "forbidden_address"
    assert web.seen == []  # refused before any connection


def test_redirects_are_checked_hop_by_hop(web):
    web.routes["/redirect-metadata"] = "http://169.254.169.254/latest/meta-data/"
    web.routes["/redirect-v6"] = f"http://[::1]:{web.port}/page"
    web.routes["/redirect-ok"] = "/page"
    for path in ("/redirect-metadata", "/redirect-v6"):
        with pytest.raises(ToolError) as error:
            fetch(f"{web.url}{path}")
        assert error.value.type == "forbidden_address"
    assert fetch(f"{web.url}/redirect-ok")["url"] == f"{web.url}/page"
    web.routes["/redirect-loop"] = "/redirect-loop"
    with pytest.raises(ToolError, match="redirects"):
        fetch(f"{web.url}/redirect-loop")


def test_allow_list_by_network():
    settings = ToolSettings(web_allow=("127.0.0.0/8",))
    with WebServer() as web:
        assert fetch(f"http://localhost:{web.port}/plain", settings)["text"] == "just text"


def test_caps_and_failures(web):
    big = fetch(f"{web.url}/big")
    assert big["truncated"].startswith(f"the first {web_url.MAX_TEXT_CHARS} of")
    assert len(big["text"]) == web_url.MAX_TEXT_CHARS
    for path, kind in (("/image", "unsupported_content"), ("/missing", "fetch_failed")):
        with pytest.raises(ToolError) as error:
            fetch(f"{web.url}{path}")
        assert error.value.type == kind
    for url in ("file:///etc/passwd", "ftp://example.com/", "http://user:pw@example.com/"):
        with pytest.raises(ToolError) as error:
            fetch(url)
        assert error.value.type == "invalid_arguments"


def test_search_tools_unconfigured_say_what_to_set():
    for tool, flag in ((WEB_SEARCH, "--web-search-url"), (LINKUP_SEARCH, "--linkup-api-key")):
        with pytest.raises(ToolError) as error:
            tool.run({"query": "otters"}, ToolContext(ToolSettings()))
        assert error.value.type == "not_configured" and flag in error.value.msg


def test_searxng_backend(web):
    out = WEB_SEARCH.run({"query": "otters"}, ToolContext(ToolSettings(searxng_url=web.url))).result
    assert [r["title"] for r in out["results"]] == [f"Result {i}" for i in range(5)]
    assert web.seen[-1][1] == "/search?q=otters&format=json"


def test_linkup_backend(web):
    settings = ToolSettings(linkup_api_key="key-1", linkup_url=f"{web.url}/v1")
    out = LINKUP_SEARCH.run({"query": "otters"}, ToolContext(settings)).result
    assert out["results"] == [{"title": "Linkup result", "url": "https://example.org/a",
                               "snippet": "linked"}]
    assert web.seen[-1][3] == {"q": "otters", "depth": "standard", "outputType": "searchResults"}
    with pytest.raises(ToolError) as error:
        LINKUP_SEARCH.run({"query": "otters"}, ToolContext(
            ToolSettings(linkup_api_key="wrong", linkup_url=f"{web.url}/v1")))
    assert error.value.type == "search_failed"
