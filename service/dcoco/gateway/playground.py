"""GET /playground: one static page (`playground.html`, no build step, nothing fetched from
elsewhere) that streams answers through the ordinary chat route and colours each token by where
it came from (the stream extension of `pieces.py`).

The page writes model output only as text (textContent), never as HTML. Its Content Security
Policy admits exactly its own inline script and style, by hash, and connections to this origin:
even a bug that let markup through could neither run script nor load anything.
"""

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()


@cache
def page() -> tuple[str, dict[str, str]]:
    """The page and its security headers."""
    html = resources.files("dcoco.gateway").joinpath("playground.html").read_text()
    scripts = " ".join(_hashes(html, "script"))
    styles = " ".join(_hashes(html, "style"))
    policy = (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return html, headers


def _hashes(html: str, tag: str) -> list[str]:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in bodies
    ]


@router.get("/playground", include_in_schema=False)
async def playground() -> HTMLResponse:
    html, headers = page()
    return HTMLResponse(html, headers=headers)
