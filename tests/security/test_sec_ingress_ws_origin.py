"""Attack: cross-site WebSocket hijacking (issue 21, item 2). A page on another site
opens a socket to the ingress from the user's browser (which would carry the user's
cookies, with a cookie authenticator): the upgrade's ``Origin`` is checked against the
page's own origin and ``cors_origins``, and refused (403) before anything is accepted."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.ingress_support import ALICE, make_config, serve_app, ws_url

pytestmark = pytest.mark.ray


@pytest.fixture
def start(ray_local, tmp_path):
    def run(**overrides):
        namespace = f"secorigin-{tmp_path.name[-10:]}".replace("_", "-")
        return serve_app(make_config(str(tmp_path / "root"), namespace, **overrides))

    return run


def test_a_cross_origin_upgrade_is_refused(start, tmp_path):
    with start(cors_origins=["http://ui.example"]) as base:
        url = ws_url(base, "chat", "alice-origin")
        for origin in ("http://evil.example", "null", "http://ui.example.evil.example"):
            with pytest.raises(InvalidStatus) as refused:
                connect(url, additional_headers=ALICE, origin=origin, open_timeout=30)
            assert refused.value.response.status_code == 403
        assert not list((tmp_path / "root").rglob("*.duckdb"))
        # The configured origin, the page's own, and a client that is no browser: open.
        for origin in ("http://ui.example", base, None):
            with connect(url, additional_headers=ALICE, origin=origin, open_timeout=30) as ws:
                assert "cf_agent_identity" in ws.recv(timeout=30)
