"""`web:url`: fetch a page and return its readable text.

Server-side request forgery is the danger: a model (or whoever wrote its prompt)
choosing URLs that reach the Suite's own network. So every hop, the first and each
redirect, is checked after its host name is resolved: an address that is private,
loopback, link-local, multicast, reserved or unspecified (IPv4 or IPv6, IPv4-mapped
included) is refused unless the operator allow-lists it (`--web-url-allow`: hosts,
addresses or networks). The connection then goes to the very address that was
checked (the Host header and TLS server name keep the name), so a DNS answer that
changes between check and connect cannot slip through. Bodies are capped at
MAX_BYTES, redirects at MAX_REDIRECTS, the whole fetch at TIMEOUT_S.
"""

import ipaddress
import socket
import time
from urllib.parse import urljoin, urlsplit

import httpx

from amity.suite.tools.base import (BuiltinTool, ToolContext, ToolError, ToolOutput, string_arg,
                                    text_output)
from amity.suite.tools.readable import readable_text

MAX_BYTES = 2 << 20
MAX_TEXT_CHARS = 20_000
MAX_REDIRECTS = 5
TIMEOUT_S = 15.0
USER_AGENT = "amity-web-url/0.1 (+tool-assisted chat)"


def _refused(msg: str) -> ToolError:
    return ToolError("forbidden_address", msg)


def _allowed(host: str, address: ipaddress._BaseAddress, allow: tuple[str, ...]) -> bool:
    for entry in allow:
        if entry.lower() == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def _internal(address: ipaddress._BaseAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (address.is_private or address.is_loopback or address.is_link_local
            or address.is_multicast or address.is_reserved or address.is_unspecified
            or not address.is_global)


def resolve_checked(host: str, port: int, allow: tuple[str, ...]) -> str:
    """The address to connect to; ToolError when `host` resolves to an internal one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ToolError("fetch_failed", f"cannot resolve {host!r}: {error}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for address in addresses:  # every answer, so none of them can be internal
        if _internal(address) and not _allowed(host, address, allow):
            raise _refused(f"{host} resolves to {address}, an internal address: refused")
    return str(addresses[0])


def _target(url: str, allow: tuple[str, ...]) -> tuple[str, str, dict]:
    """(URL with the checked address as host, Host header, request extensions)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolError("invalid_arguments", f"only http(s) URLs can be fetched, not {url!r}")
    if parts.username or parts.password:
        raise ToolError("invalid_arguments", "URLs with credentials are not fetched")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = resolve_checked(parts.hostname, port, allow)
    literal = f"[{address}]" if ":" in address else address
    pinned = parts._replace(netloc=f"{literal}:{port}").geturl()
    default_port = port == (443 if parts.scheme == "https" else 80)
    host_header = parts.hostname if default_port else f"{parts.hostname}:{port}"
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return pinned, host_header, extensions


def fetch(url: str, allow: tuple[str, ...]) -> tuple[str, str, bytes]:
    """(final URL, content type, body) following redirects, each hop checked."""
    deadline = time.monotonic() + TIMEOUT_S
    with httpx.Client(follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            pinned, host, extensions = _target(url, allow)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ToolError("fetch_failed", f"the fetch took longer than {TIMEOUT_S:g} s")
            try:
                with client.stream("GET", pinned, headers={"Host": host, "User-Agent": USER_AGENT},
                                   extensions=extensions, timeout=left) as response:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    body = b""
                    for chunk in response.iter_bytes():
                        body += chunk
                        if len(body) > MAX_BYTES:
                            break
                        if time.monotonic() > deadline:
                            raise ToolError("fetch_failed",
                                            f"the fetch took longer than {TIMEOUT_S:g} s")
                    if response.status_code >= 400:
                        raise ToolError("fetch_failed", f"{url} answered {response.status_code}")
                    return url, response.headers.get("content-type", ""), body[:MAX_BYTES]
            except httpx.HTTPError as error:
                raise ToolError("fetch_failed", f"cannot fetch {url}: {error}") from None
    raise ToolError("fetch_failed", f"more than {MAX_REDIRECTS} redirects")


def run(args: dict, context: ToolContext) -> ToolOutput:
    url = string_arg(args, "url", 2048).strip()
    final_url, content_type, body = fetch(url, context.settings.web_allow)
    kind = content_type.split(";")[0].strip().lower()
    if kind in ("text/html", "application/xhtml+xml") or (not kind and b"<html" in body[:1000].lower()):
        title, text = readable_text(body.decode("utf-8", "replace"))
    elif kind.startswith("text/") or kind in ("application/json", "application/xml", ""):
        title, text = "", body.decode("utf-8", "replace")
    else:
        raise ToolError("unsupported_content", f"{final_url} is {kind}, not text")
    return text_output({"url": final_url, "title": title}, text, MAX_TEXT_CHARS)


TOOL = BuiltinTool(
    type="web:url",
    description="Fetch a web page and return its readable text.",
    parameters={"type": "object", "properties": {
        "url": {"type": "string", "description": "The http(s) URL to read."}},
        "required": ["url"]},
    run=run,
)
