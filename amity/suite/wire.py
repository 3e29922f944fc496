"""Wire types the Suite's schemas share.

Strings are bounded and NUL-free: PostgreSQL cannot store a NUL in text and raises
on a value longer than its column, and either would be a 500 instead of a 422.
"""

from typing import Annotated

from pydantic import AfterValidator, StringConstraints


def no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Name = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(no_nul)]
Text = Annotated[str, StringConstraints(max_length=100_000), AfterValidator(no_nul)]
