"""Password masking for free text: driver messages, test logs, command lines, JSON rows.

A secret is masked where a secret can stand: the user-info of anything shaped like a URL,
``password=`` / ``password: `` fields (DSNs, keyword arguments, JSON, YAML, reprs) and the
password fields of runstore's own objects (`masked_repr`). Elsewhere in the text only a
*strong* secret is masked (`is_strong_secret`: long and mixing kinds of characters), and
only as a whole token: a password that is an ordinary word (``postgres``, ``admin``,
``only``) would otherwise garble every message holding that word. `runstore.urls`
remembers the password of every URL it parses (`remember_secret`); weak ones are not kept.

It imports nothing from runstore, so errors (`runstore.errors`) can mask their causes
without an import cycle.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import fields
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "***"
#: Strong passwords of URLs seen in this process; `redact` masks them as whole tokens anywhere.
_SECRETS: set[str] = set()
#: A secret shorter than this is never looked for outside a secret's place.
MIN_SECRET_LENGTH = 8
#: A URL in text ends at white space, a quote, ``<>``, or a comma that starts the next URL
#: of a comma-joined list (``-b memory://,postgresql://u@h/db``).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://(?:(?!,[A-Za-z][A-Za-z0-9+.\-]*://)[^\s\"'<>])*")
#: ``password=x``, ``sslpassword='x'``, ``"password": "x"``, ``PGPASSWORD=x``, ``pwd: x``.
_FIELD = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9])
    (?P<key>["']?[A-Za-z_]*(?:password|passwd|pwd)["']?\s*(?:=|:)\s*)
    (?:
        "(?P<dq>(?:[^"\\]|\\.)*)"
      | '(?P<sq>(?:[^'\\]|\\.)*)'
      | (?P<bare>[^\s"',;&)}\]]+)
    )
    """
)
_NOT_SECRETS = {"none", "null", "true", "false", REDACTED}


def is_strong_secret(secret: str) -> bool:
    """Whether ``secret`` is masked wherever it stands as a whole token: at least 8
    characters of three kinds (lower case, upper case, digits, others), or 16 of two."""
    kinds = sum((any(c.islower() for c in secret), any(c.isupper() for c in secret),
                 any(c.isdigit() for c in secret), any(not c.isalnum() for c in secret)))
    return len(secret) >= MIN_SECRET_LENGTH and (kinds >= 3 or (kinds >= 2 and len(secret) >= 16))


def remember_secret(password: str | None) -> None:
    """Remember ``password`` so `redact` masks it anywhere in later text, if it is strong;
    a weak one is masked only where a secret stands (URL user-info, password fields)."""
    if password and password != REDACTED and is_strong_secret(password):
        _SECRETS.add(password)


@lru_cache(maxsize=256)
def _pattern(secret: str) -> re.Pattern[str]:
    """Every spelling of ``secret`` (raw, percent-encoded, JSON, repr, XML) as a whole token."""
    xml_text = html.escape(secret, quote=False)
    xml_attribute = xml_text.replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")
    base = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret), repr(secret)[1:-1],
            xml_text, html.escape(secret), xml_attribute, xml_attribute.replace("\t", "&#09;")}
    spellings = {form for spelled in base for form in (spelled, json.dumps(spelled)[1:-1],
                                                       json.dumps(spelled, ensure_ascii=False)[1:-1])}
    alternatives = "|".join(re.escape(s) for s in sorted(spellings, key=len, reverse=True))
    # A whole token: a secret glued to letters or digits is part of another word.
    return re.compile(rf"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])")


def redact(text: str) -> str:
    """Mask secrets in free text: URL user-info passwords, ``password=`` fields, and the
    strong passwords seen in this process as whole tokens in any spelling."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if len(secret) <= len(text):
            text = _pattern(secret).sub(REDACTED, text)
    text = _FIELD.sub(_mask_field, text)
    return _URL_IN_TEXT.sub(_mask_user_info, text)


def _mask_field(match: re.Match[str]) -> str:
    for group, quote_char in (("dq", '"'), ("sq", "'"), ("bare", "")):
        value = match.group(group)
        if value is not None:
            if not value or value.lower() in _NOT_SECRETS or "://" in value:
                return match.group(0)  # nothing secret, or a URL (masked by its own rule)
            return f"{match.group('key')}{quote_char}{REDACTED}{quote_char}"
    return match.group(0)


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


def _is_secret_field(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in ("password", "passwd", "secret"))


def masked_repr(obj: Any) -> str:
    """A dataclass's repr with every password masked: use as ``__repr__ = masked_repr``."""
    shown = ", ".join(
        f"{f.name}={REDACTED!r}" if _is_secret_field(f.name) and getattr(obj, f.name) else
        f"{f.name}={getattr(obj, f.name)!r}"
        for f in fields(obj) if f.repr
    )
    return redact(f"{type(obj).__qualname__}({shown})")
