"""Credentials never leave the harness inside a URL (pure).

Why: a user may write basic-auth credentials into a URL
(``--cp-prometheus-url http://user:secret@prometheus:9090``, a kubeconfig's
``server:``), and URLs end up in skip reasons, one-line errors, progress lines,
the Allure environment and attachments. Every URL the harness shows goes
through ``url``; every one-line error goes through ``text``
(``clusterproof.core.errors.HarnessError`` does it itself), which finds URLs inside
free text (an exception's message) too. The credentials themselves are used
only where they are needed (``split_userinfo``: the Prometheus client sends
them as an ``Authorization`` header and keeps a URL without them).
"""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
# scheme://<userinfo>@ -- the userinfo runs to the authority's last "@" (a password may hold an
# unescaped "@"; URL parsers split at the last one), never past the path, query or fragment.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s?#'\"<>]*@")


def text(s: str) -> str:
    """``s`` with the userinfo of every ``scheme://user:pass@`` in it replaced by ``***``."""
    return _USERINFO.sub(rf"\g<scheme>{MASK}@", s)


def url(u: str) -> str:
    """A URL fit to print: its userinfo (``user:pass@``) replaced by ``***``. Also for input that is
    not a URL at all (``user:pass@host`` without a scheme): everything before its last ``@`` goes."""
    s = text(str(u))
    if "@" in s and "://" not in s:
        s = f"{MASK}@{s.rsplit('@', 1)[1]}"
    return s


def split_userinfo(u: str) -> tuple[str, tuple[str, str] | None]:
    """(``u`` without its userinfo, (user, password) percent-decoded, or None if it had none).
    ``u`` must parse (``urllib.parse.urlsplit``); the caller validates it first."""
    parts = urlsplit(u)
    if parts.username is None and parts.password is None:
        return u, None
    host = parts.hostname or ""
    if ":" in host:   # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return (urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)),
            (unquote(parts.username or ""), unquote(parts.password or "")))
