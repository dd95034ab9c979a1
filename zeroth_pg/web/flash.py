"""The message a page shows after an action ("done: pause hourly", "event x emitted; runs woken:
1"), made unforgeable (issue 31).

An action answers a POST with a redirect to a page (post/redirect/get); the page's message used to
ride on that redirect as plain query parameters (``?done=…``, ``?emitted=…&woken=…``), so any
link — a web page in the operator's browser, a phishing mail — could make the dashboard say
"done" or print text of the attacker's choosing. Now :class:`FlashMiddleware`, the innermost
layer of the dashboard:

* on the way out, moves those parameters (:data:`FLASH_KEYS`) of a redirect that answers a POST
  into one ``flash`` value signed with the dashboard's per-process secret (HMAC-SHA256), bound to
  the browser's session cookie (``zp_session``, the one the CSRF token is bound to) and valid for
  :data:`FLASH_SECONDS`;
* on the way in, strips every :data:`FLASH_KEYS` parameter and ``flash`` from a GET, and puts back
  the values of a ``flash`` that verifies: right signature, this session, not expired. A forged,
  tampered, expired or another browser's ``flash`` shows nothing.

The page modules keep reading ``done`` (and the rest) from the query as before: only values this
process signed for this browser reach them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
import urllib.parse
from collections.abc import Mapping

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

__all__ = ["FLASH_KEYS", "FLASH_SECONDS", "FlashMiddleware", "read", "sign"]

#: The query parameters that carry a page's message after an action: never taken from a link.
FLASH_KEYS = frozenset({"done", "emitted", "woken", "repeat"})
#: How long a signed message shows (a page refreshing itself keeps it that long).
FLASH_SECONDS = 120
#: The longest ``flash`` value read (the messages are short: names of at most 200 characters).
_FLASH_MAX = 4096
_SAFE = frozenset({"GET", "HEAD"})


def _mac(secret: bytes, session: str, body: str) -> str:
    return hmac.new(secret, f"{session}\0{body}".encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, session: str, values: Mapping[str, str], *,
         now: float | None = None) -> str:
    """``values`` as one ``flash`` value for the browser of ``session``, valid
    :data:`FLASH_SECONDS` from ``now`` (default: the clock)."""
    expires = int((time.time() if now is None else now) + FLASH_SECONDS)
    packed = base64.urlsafe_b64encode(urllib.parse.urlencode(sorted(values.items())).encode())
    body = f"{expires}.{packed.decode()}"
    return f"{body}.{_mac(secret, session, body)}"


def read(secret: bytes, session: str, token: str, *,
         now: float | None = None) -> dict[str, str]:
    """The values of a ``flash`` this secret signed for ``session`` and that has not expired at
    ``now``; {} for anything else (forged, tampered, expired, another session's, malformed)."""
    if not session or len(token) > _FLASH_MAX or token.count(".") != 2:
        return {}
    body, _, mac = token.rpartition(".")
    if not hmac.compare_digest(mac.encode(), _mac(secret, session, body).encode()):
        return {}
    expires, _, packed = body.partition(".")
    try:
        if int(expires) < (time.time() if now is None else now):
            return {}
        text = base64.urlsafe_b64decode(packed.encode()).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return {}
    return {k: v for k, v in urllib.parse.parse_qsl(text) if k in FLASH_KEYS}


class FlashMiddleware(BaseHTTPMiddleware):
    """Signs the message of an action's redirect, and shows only signed ones (see the module)."""

    def __init__(self, app: ASGIApp, secret: bytes) -> None:
        super().__init__(app)
        self.secret = hashlib.sha256(b"zeroth-pg web flash\0" + secret).digest()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        session = request.cookies.get("zp_session") or ""
        if request.method in _SAFE:
            pairs = urllib.parse.parse_qsl(request.scope.get("query_string", b"").decode(
                "latin-1"), keep_blank_values=True)
            kept = [(k, v) for k, v in pairs if k not in FLASH_KEYS and k != "flash"]
            token = next((v for k, v in pairs if k == "flash"), "")
            shown = read(self.secret, session, token) if token else {}
            if len(kept) != len(pairs) or shown:
                # The same dict the app below reads: the page sees only signed values.
                request.scope["query_string"] = urllib.parse.urlencode(
                    kept + sorted(shown.items())).encode("latin-1", "replace")
            return await call_next(request)
        response = await call_next(request)
        location = response.headers.get("location")
        if location and 300 <= response.status_code < 400:
            parts = urllib.parse.urlsplit(location)
            pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            message = {k: v for k, v in pairs if k in FLASH_KEYS}
            if message or any(k == "flash" for k, _ in pairs):
                kept = [(k, v) for k, v in pairs if k not in FLASH_KEYS and k != "flash"]
                if message and session:
                    kept.append(("flash", sign(self.secret, session, message)))
                response.headers["location"] = urllib.parse.urlunsplit(
                    parts._replace(query=urllib.parse.urlencode(kept)))
        return response
