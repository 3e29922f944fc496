"""`ImageInput`: a data URI, bare base64, or an http(s) URL that the server fetches.

Fetching a URL is a request the server makes on a client's behalf, so it must not
reach what only the server can reach: every address the host name resolves to (and,
after a redirect, every address of the next host) must be a public one, unless it lies
in the allow-list (`--image-fetch-allow`). The connection then goes to the address
that was checked, not to a second lookup, so a name cannot resolve to a public address
for the check and a private one for the connection. The body is capped at the spec's
50 MiB and the whole fetch, redirects included, at `--image-fetch-timeout` seconds.
"""

import asyncio
import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import httpx

from amity.images.codec import BadImage

MAX_IMAGE_BYTES = 50 * 2**20  # the spec's limit for an ImageInput
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass
class FetchPolicy:
    allow: list = field(default_factory=list)  # ip_network objects
    timeout_s: float = 10.0

    @classmethod
    def from_flags(cls, allow: str | None, timeout_s: float) -> "FetchPolicy":
        networks = [ipaddress.ip_network(n.strip(), strict=False)
                    for n in (allow or "").split(",") if n.strip()]
        return cls(networks, timeout_s)

    def permits(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_global or any(ip in net for net in self.allow)


async def image_bytes(value: str, policy: FetchPolicy, loc: tuple) -> bytes:
    """The bytes an ImageInput names, or BadImage (a 422) saying why not."""
    if value.startswith(("http://", "https://")):
        try:
            async with asyncio.timeout(policy.timeout_s):
                return await _fetch(value, policy, loc)
        except TimeoutError:
            raise BadImage(f"fetching the image took longer than {policy.timeout_s:g} s",
                           loc) from None
    if value.startswith("data:"):
        header, sep, value = value.partition(",")
        if not sep or not header.endswith(";base64"):
            raise BadImage("a data URI must be base64: data:image/png;base64,...", loc)
    if len(value) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise BadImage(f"the image is larger than {MAX_IMAGE_BYTES // 2**20} MiB", loc)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("`image` must be an http(s) URL, a data URI or base64 image bytes",
                       loc) from None


async def _checked_address(host: str, port: int, policy: FetchPolicy, loc: tuple) -> str:
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise BadImage(f"the image URL's host {host!r} does not resolve ({err.strerror})",
                       loc) from None
    addresses = [info[4][0] for info in infos]
    refused = [a for a in addresses if not policy.permits(a)]
    if refused:
        raise BadImage(f"the image URL's host {host!r} resolves to a private, loopback or "
                       f"link-local address ({refused[0]}); the server does not fetch those",
                       loc)
    return addresses[0]


async def _fetch(url: str, policy: FetchPolicy, loc: tuple) -> bytes:
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise BadImage(f"cannot fetch {url!r}: only http(s) URLs", loc)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            address = await _checked_address(parts.hostname, port, policy, loc)
            netloc = f"[{address}]" if ":" in address else address
            pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
            request = client.build_request(
                "GET", pinned, headers={"Host": parts.netloc.rpartition("@")[2]},
                extensions={"sni_hostname": parts.hostname})
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as err:
                raise BadImage(f"fetching the image failed: {type(err).__name__}", loc) from None
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise BadImage(f"fetching the image failed: HTTP {response.status_code}", loc)
                return await _capped_body(response, loc)
            finally:
                await response.aclose()
    raise BadImage(f"fetching the image took more than {MAX_REDIRECTS} redirects", loc)


async def _capped_body(response: httpx.Response, loc: tuple) -> bytes:
    too_big = BadImage(f"the image is larger than {MAX_IMAGE_BYTES // 2**20} MiB", loc)
    if int(response.headers.get("content-length") or 0) > MAX_IMAGE_BYTES:
        raise too_big
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_IMAGE_BYTES:
            raise too_big
    return bytes(body)
