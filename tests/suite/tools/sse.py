"""Reading a tool-assisted stream: `(event, data)` pairs, `event` None for token
chunks and "[DONE]" as the data of the last."""

import json


def read_events(lines) -> list[tuple[str | None, object]]:
    events, name = [], None
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            payload = line[5:].strip()
            events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
            name = None
    return events
