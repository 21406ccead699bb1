"""The web page at / and the status route it reads: what is served, with which headers, to
whom, and what /status tells. The page's behaviour in a browser is tested in
tests/integration/test_web_page_browser.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.cli import main as cli_main
from reame_core.settings import Settings
from reame_core.web import page

Serve = Callable[..., TestClient[Litestar]]
ASSET_BUDGET = 64_000  # bytes, every file of the page together
KEY = "sk-test"


def test_page_is_html_with_a_strict_content_security_policy(client: TestClient[Litestar]) -> None:
    response = client.get("/")

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "<title>Reame</title>" in response.text


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("main.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ],
)
def test_assets_are_served_with_their_content_type(
    client: TestClient[Litestar], name: str, media_type: str
) -> None:
    response = client.get(f"/web/{name}")

    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert "default-src 'self'" in response.headers["content-security-policy"]


def test_every_file_the_page_names_is_served(client: TestClient[Litestar]) -> None:
    html = client.get("/").text
    scripts = {name for name in page.ASSETS if name.endswith(".js")}
    named = set(re.findall(r'(?:src|href)="/web/([^"]+)"', html))
    imported = {
        found
        for name in scripts
        for found in re.findall(r'from "\./([^"]+)"', client.get(f"/web/{name}").text)
    }

    assert named | imported
    for name in named | imported:
        assert client.get(f"/web/{name}").status_code == 200, name


def test_page_holds_no_inline_script_or_style(client: TestClient[Litestar]) -> None:
    html = client.get("/").text

    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) is None
    assert "<style" not in html
    assert re.search(r"\son[a-z]+=", html) is None
    assert re.search(r"\sstyle=", html) is None


def test_scripts_never_insert_text_as_markup() -> None:
    folder = resources.files("reame_core.web") / "static"
    for entry in folder.iterdir():
        if entry.name.endswith(".js"):
            source = entry.read_text()
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
                assert sink not in source, f"{entry.name} uses {sink}"


def test_assets_fit_the_size_budget() -> None:
    total = sum(len(asset.body) for asset in page.ASSETS.values())

    assert 0 < total <= ASSET_BUDGET


def test_unknown_asset_is_404(client: TestClient[Litestar]) -> None:
    assert client.get("/web/nothing.js").status_code == 404
    assert client.get("/web/index.html").status_code == 404


def test_no_web_serves_no_page(serve: Serve) -> None:
    client = serve(Settings(web=False))

    assert client.get("/").status_code == 404
    assert client.get("/web/main.js").status_code == 404
    assert client.get("/status").status_code == 200  # the API stays


def test_no_web_flag_and_environment_turn_the_page_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def web(*flags: str) -> bool:
        args = cli_main.build_parser().parse_args(["serve", *flags])
        return cli_main.settings_from(args, model=None).web

    assert web() is True
    assert web("--no-web") is False
    monkeypatch.setenv("REAME_WEB", "0")
    assert web() is False


def test_page_needs_no_key_but_status_does(serve: Serve) -> None:
    client = serve(Settings(api_keys=[KEY]))

    assert client.get("/").status_code == 200
    assert client.get("/web/main.js").status_code == 200
    assert client.get("/status").status_code == 401
    authorized = client.get("/status", headers={"Authorization": f"Bearer {KEY}"})
    assert authorized.status_code == 200
