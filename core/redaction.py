"""Password masking for free text: driver messages, test logs, command lines, JSON rows.

`runstore.urls` remembers the password of every URL it parses (`remember_secret`);
`redact` masks every password seen in this process in the spellings text gives it
(raw, percent-encoded, JSON, repr, XML), and the user-info of anything shaped like a
URL. It imports nothing from runstore, so errors (`runstore.errors`) can mask their
causes without an import cycle.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import fields
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "***"
#: Passwords of every URL seen in this process; `redact` masks them wherever they appear.
_SECRETS: set[str] = set()
#: Shorter passwords are masked inside URLs only: masking every "abc" of a log would garble it.
MIN_SECRET_LENGTH = 4
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]*")


def remember_secret(password: str | None) -> None:
    """Remember ``password`` so `redact` masks it from now on (short ones are masked in URLs only)."""
    if password and len(password) >= MIN_SECRET_LENGTH and password != REDACTED:
        _SECRETS.add(password)


def _spellings(secret: str) -> set[str]:
    """The ways ``secret`` may be written in text: raw, percent-encoded, JSON, repr, XML."""
    xml_text = html.escape(secret, quote=False)
    xml_attribute = xml_text.replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")
    base = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret), repr(secret)[1:-1],
            xml_text, html.escape(secret), xml_attribute, xml_attribute.replace("\t", "&#09;")}
    return {form for spelled in base for form in (spelled, json.dumps(spelled)[1:-1],
                                                  json.dumps(spelled, ensure_ascii=False)[1:-1])}


def redact(text: str) -> str:
    """Mask passwords in free text: every password seen in this process, in any spelling,
    and the user-info password of anything shaped like a URL."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if len(secret) > len(text):
            continue
        for spelled in sorted(_spellings(secret), key=len, reverse=True):
            if spelled in text:
                text = text.replace(spelled, REDACTED)
    return _URL_IN_TEXT.sub(_mask_user_info, text)


def _mask_user_info(match: re.Match[str]) -> str:
    url = match.group(0)
    scheme, _, rest = url.partition("://")
    ends = [i for i in (rest.find(ch) for ch in "/?#") if i >= 0]
    authority = rest[: min(ends, default=len(rest))]
    at = authority.rfind("@")
    if at >= 0:
        user, colon, _ = authority[:at].partition(":")
        return f"{scheme}://{user}:{REDACTED}{rest[at:]}" if colon else url
    at = rest.rfind("@")
    if at < 0:
        return url
    # An '@' past the host part: most likely a password with an unencoded / ? or #.
    return f"{scheme}://{REDACTED}{rest[at:]}"


def masked_repr(obj: Any) -> str:
    """A dataclass's repr with every password masked: use as ``__repr__ = masked_repr``."""
    shown = ", ".join(f"{f.name}={getattr(obj, f.name)!r}" for f in fields(obj) if f.repr)
    return redact(f"{type(obj).__qualname__}({shown})")
