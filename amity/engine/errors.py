"""Errors the engine raises for bad requests.

The server turns a `RequestError` into a 422 whose `loc` names `field`, so every
check made below the HTTP layer still reaches the client as a clear message.
"""


class RequestError(ValueError):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
