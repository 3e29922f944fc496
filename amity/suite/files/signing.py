"""HMAC-SHA256 signatures for the URLs the local object store hands out.

The key lives in the database (`settings`), so it survives restarts and every Suite
process on one database signs alike."""

import hashlib
import hmac
import secrets

from sqlalchemy.orm import Session

from amity.suite.store.models import Setting

KEY_SETTING = "url_signing_key"


class Signer:
    def __init__(self, key: bytes):
        self._key = key

    def sign(self, *parts: str) -> str:
        message = "\n".join(parts).encode("utf-8", "replace")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, signature: str, *parts: str) -> bool:
        # As bytes: compare_digest refuses non-ASCII str (a TypeError, so a 500).
        return hmac.compare_digest(self.sign(*parts).encode(), signature.encode("utf-8", "replace"))


def signing_key(session: Session) -> bytes:
    setting = session.get(Setting, KEY_SETTING)
    if setting is None:
        setting = Setting(key=KEY_SETTING, value=secrets.token_hex(32))
        session.add(setting)
        session.commit()
    return bytes.fromhex(setting.value)
