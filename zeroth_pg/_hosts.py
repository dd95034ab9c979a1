"""Host names the HTTP servers answer (the dashboard, the metrics exporter): DNS rebinding.

A page on a name whose DNS an attacker points at 127.0.0.1 sends its own name as Host; a server
that answers only loopback names, the address it is bound to and the names an operator allowed
never serves that page. One home for parsing a Host header and an allow-list entry.
"""

from __future__ import annotations

import contextlib
import ipaddress
import urllib.parse

__all__ = ["LOOPBACK_HOSTS", "host_allowed", "host_name", "netloc"]

#: The Host names a server always answers; an allow-list adds to them.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def host_name(entry: str) -> str:
    """An allow-list entry (``name``, ``name:port``, ``::1``, ``[::1]:port``) as a bare name;
    ValueError for anything else (a URL, ``user@name``, a bad port), which no Host could match."""
    name = entry.strip().lower()
    if name.count(":") > 1 and not name.startswith("["):
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(name))  # a bare IPv6 address
    elif found := netloc(name):
        return found[0]
    raise ValueError(f"not an allowed host name: {entry[:100]!r} (give a name or address as the "
                     "browser's Host header carries it, e.g. dash.example.com or 10.0.0.5, "
                     "without a scheme, path or user)")


def netloc(value: str) -> tuple[str, int | None] | None:
    """A Host header (or the host[:port] of a URL) as (lower-case name, port or None); None
    when it is not one (empty, a user part, a path, a bad port)."""
    if not value or any(c in value for c in "/@?#\\ \t"):
        return None
    try:
        parts = urllib.parse.urlsplit("//" + value)
        name, port = (parts.hostname or "").rstrip("."), parts.port
    except ValueError:
        return None
    return (name, port) if name else None


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether a Host header names one of ``allowed`` (bare lower-case names, from
    :func:`host_name`), whatever its port."""
    found = netloc(header)
    return found is not None and found[0].strip("[]") in allowed
