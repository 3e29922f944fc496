"""Opaque list cursors: URL-safe base64 of a small JSON object.

The 0.12.8 SDK types `nextCursor` as bytes and sends it back as Python's `str(bytes)`,
`b'...'`; both forms decode. A cursor that does not decode is a 422, never a 500.
"""

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Literal

from fastapi import Query

from sqlalchemy import Select

from amity.suite.errors import ApiError

DEFAULT_LIMIT = 20


def encode_cursor(after_pk: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": after_pk}).encode()).decode()


def decode_cursor(cursor: str) -> int:
    text = cursor.strip()
    if len(text) >= 3 and text[:2] in ("b'", 'b"') and text[-1] == text[1]:
        text = text[2:-1]
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        after = value["after"]
        if isinstance(after, int) and not isinstance(after, bool):
            return after
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        pass
    raise ApiError(422, "`cursor` is not one this server gave out; send back `nextCursor` as is",
                   loc=("query", "cursor"), type="invalid_cursor")


@dataclass
class Page:
    cursor: str | None
    limit: int | None
    direction: str | None

    def apply(self, query: Select, key) -> Select:
        """`query` ordered by the integer column `key`, from the cursor on, one row
        more than the page holds (which says whether there is a next page)."""
        descending = self.direction == "desc"
        if self.cursor:
            after = decode_cursor(self.cursor)
            query = query.where(key < after if descending else key > after)
        return query.order_by(key.desc() if descending else key.asc()).limit(self.size + 1)

    @property
    def size(self) -> int:
        return self.limit or DEFAULT_LIMIT

    def cut(self, rows: list, key_of) -> tuple[list, str | None]:
        """The page's rows and the cursor of the next page (None: no more)."""
        if len(rows) <= self.size:
            return rows, None
        rows = rows[:self.size]
        return rows, encode_cursor(key_of(rows[-1]))


def page_params(
    cursor: str | None = Query(None, description="`nextCursor` of the previous page."),
    limit: int | None = Query(DEFAULT_LIMIT, ge=1, le=100),
    direction: Literal["asc", "desc"] | None = Query(None),
) -> Page:
    return Page(cursor, limit, direction)
