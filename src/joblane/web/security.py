"""Who may reach the dashboard and how a form proves it came from the dashboard.

- Bound to loopback, the page answers only requests whose Host is a loopback
  name (a web page elsewhere cannot reach it through DNS rebinding).
- Bound to anything else, ``JOBLANE_DASHBOARD_TOKEN`` is required: a browser
  signs in once with it (an HttpOnly, SameSite=Strict cookie), scripts send
  ``Authorization: Bearer <token>``.
- Every state change is a POST carrying a CSRF token: an HMAC, under a key
  that lives only in this process, of a random value kept in a cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # only annotations: `joblane dashboard` reads TOKEN_ENV and bind_problem without the web extra
    from starlette.requests import Request

TOKEN_ENV = "JOBLANE_DASHBOARD_TOKEN"
CSRF_COOKIE = "joblane_csrf"
AUTH_COOKIE = "joblane_auth"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
MIN_TOKEN_LENGTH = 16


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    host = host.strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, token: str | None) -> str | None:
    """Why the dashboard must not start on ``host`` with ``token``, or None."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        return (f"{TOKEN_ENV} is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH} random characters "
                "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    if not is_loopback(host) and not token:
        return (f"--host {host} exposes the dashboard beyond this machine: set {TOKEN_ENV} to a long random secret, "
                "or bind 127.0.0.1")
    return None


def request_host(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """The dashboard's security settings and checks, one per running dashboard."""

    def __init__(self, *, token: str | None, loopback_only: bool, extra_hosts: tuple[str, ...] = ()):
        self.token = token or None
        self.loopback_only = loopback_only
        self.extra_hosts = set(extra_hosts)
        self._key = secrets.token_bytes(32)

    # -- where from, and who ----------------------------------------------

    def host_allowed(self, request: Request) -> bool:
        if not self.loopback_only:
            return True
        host = request_host(request)
        return host in self.extra_hosts or is_loopback(host)

    def _same(self, given: str | None) -> bool:
        if not given or self.token is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                                   hashlib.sha256(self.token.encode()).digest())

    def auth_cookie_value(self) -> str:
        """What the sign-in cookie holds: a MAC of the token, so the token itself never sits in a cookie."""
        return hmac.new(self._key, b"auth:" + (self.token or "").encode(), hashlib.sha256).hexdigest()

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and self._same(header[7:].strip()):
            return True
        cookie = request.cookies.get(AUTH_COOKIE)
        return bool(cookie) and hmac.compare_digest(cookie, self.auth_cookie_value())

    def token_matches(self, given: str | None) -> bool:
        return self._same(given)

    # -- CSRF -------------------------------------------------------------

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(24)

    def csrf_token(self, nonce: str) -> str:
        return hmac.new(self._key, b"csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or not submitted:
            return False
        if not hmac.compare_digest(self.csrf_token(nonce), submitted):
            return False
        # A browser names the page a POST came from; it must be this site.
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return False
        return True


def safe_next(target: str | None, default: str = "/") -> str:
    """A redirect target on this site only (a path, never //host or a scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target
