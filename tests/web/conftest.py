from __future__ import annotations

import warnings

import pytest

pytest.importorskip("starlette", reason="the dashboard tests need the web extra: pip install 'joblane[web]'")

# this Starlette prefers the httpx2 fork for its test client; httpx (the brokers extra) works the same here
warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from starlette.testclient import TestClient  # noqa: E402

from joblane.web import create_app  # noqa: E402

LOCAL = "http://127.0.0.1"


@pytest.fixture
def client(app):
    """The dashboard of ``app`` in-process, as a browser on this machine would reach it."""
    with TestClient(create_app(app, refresh_seconds=0), base_url=LOCAL, follow_redirects=False) as c:
        yield c


def csrf_of(client: TestClient, path: str = "/jobs") -> str:
    """The CSRF token the dashboard put in a page's forms (the cookie it pairs with stays in the client)."""
    html = client.get(path).text
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start:html.index('"', start)]
