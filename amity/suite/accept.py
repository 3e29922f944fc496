"""Whether to answer with a stream (platform-notes §0.3): when the body says
`"stream": true`, or has no `stream` field and the Accept header prefers
text/event-stream over JSON (the 0.12.8 SDK's `stream()` calls send only the header);
`"stream": false` is always JSON. One rule for every Suite route that streams:
dedicated and serverless inference, tool-assisted chat."""


def _quality(accept: str, media: str) -> float:
    best = 0.0
    for item in accept.split(","):
        kind, *params = [p.strip() for p in item.split(";")]
        if kind in (media, media.split("/")[0] + "/*") or (kind == "*/*" and best == 0):
            q = 1.0
            for p in params:
                if p.startswith("q="):
                    try:
                        q = float(p[2:])
                    except ValueError:
                        q = 0.0
            if kind == media:
                return q
            best = max(best, q * 0.999)  # a wildcard counts less than the type itself
    return best


def wants_stream(stream: bool | None, accept: str | None) -> bool:
    if stream is not None:
        return stream
    if not accept:
        return False
    return _quality(accept, "text/event-stream") > _quality(accept, "application/json")
