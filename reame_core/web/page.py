"""The routes that serve the web page and its files, with the headers that keep it safe.

The page holds no data of its own (the API calls it makes do, and those need the key), so
its files are open to everyone: `PATHS` lists them for the bearer guard. Every response
carries a Content-Security-Policy that allows scripts, styles and connections from this
server only, and no inline script or style. The page sets user and model text only as
text; the policy is the second line: markup that reached the document anyway could not
run script or load anything from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import PurePosixPath

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

ASSETS_URL = "/web"
PAGE_FILE = "index.html"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files: revalidate rather than show an older page after an upgrade.
    "Cache-Control": "no-cache",
}
# Litestar adds "; charset=utf-8" to text types.
_MEDIA_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str


def read_assets() -> dict[str, Asset]:
    """The page's files by name, read once from the installed package."""
    folder = resources.files(__package__) / "static"
    assets = {}
    for entry in folder.iterdir():
        suffix = PurePosixPath(entry.name).suffix
        if entry.is_file() and suffix in _MEDIA_TYPES:
            assets[entry.name] = Asset(entry.read_bytes(), _MEDIA_TYPES[suffix])
    return assets


ASSETS = read_assets()
PATHS = frozenset({"/", *(f"{ASSETS_URL}/{name}" for name in ASSETS if name != PAGE_FILE)})


def _respond(asset: Asset) -> Response[bytes]:
    return Response(asset.body, media_type=asset.media_type, headers=HEADERS)


@get("/", include_in_schema=False)
async def page() -> Response[bytes]:
    return _respond(ASSETS[PAGE_FILE])


@get(f"{ASSETS_URL}/{{name:str}}", include_in_schema=False)
async def asset(name: FromPath[str]) -> Response[bytes]:
    found = ASSETS.get(name) if name != PAGE_FILE else None
    if found is None:
        raise NotFoundException(f"{ASSETS_URL}/{name}")
    return _respond(found)


ROUTES = [page, asset]
