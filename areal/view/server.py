"""The viewer's HTTP server (aiohttp) and its static export: one page, JSON endpoints behind it.

    GET /                    page.html with page.css and page.js inlined (no external resource)
    GET /api/run             the run: experiment, agent, model, discount, summary.json
    GET /api/steps           metrics.jsonl rows
    GET /api/episodes        one row per episode (status, failure class and cause, reward, ...)
    GET /api/episode/{id}    one episode's conversation tree, token by token (``RunView.episode``)
    GET /api/compare/{id}    the earliest and latest episode of that episode's first prompt
    GET /api/prompts         prompts sampled at several policy versions

Answers are strict JSON (a NaN of summary.json becomes null). An unknown episode is a 404 with ``{"error": ...}``. The static export (``write_html``) is the same
page with every answer embedded (``window.RUN_DATA``), so it opens from a file with no server.
The run directory is read once, at start: restart the viewer to see a run that has moved on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from areal.jsonl import json_line
from areal.view.data import RunView

HERE = Path(__file__).parent


def page(data: dict[str, Any] | None = None) -> str:
    """The page, self-contained; with ``data`` (path -> answer) it needs no server."""
    html = (HERE / "page.html").read_text()
    css = (HERE / "page.css").read_text()
    js = (HERE / "page.js").read_text()
    # "</" would close the <script> element early: JSON allows "<\/" for it
    embedded = "" if data is None else "window.RUN_DATA = " + json_line(data).replace("</", "<\\/")
    return html.replace("/*CSS*/", css).replace("/*DATA*/", embedded).replace("/*JS*/", js)


def answers(view: RunView) -> dict[str, Any]:
    """Every endpoint's answer, keyed by its path under /api/ (the static export's data)."""
    data: dict[str, Any] = {"run": view.run(), "steps": view.steps(), "episodes": view.episodes(), "prompts": view.prompts()}
    for e in view.records:
        data[f"episode/{e}"] = view.episode(e)
        data[f"compare/{e}"] = view.compare(e)
    return data


def write_html(view: RunView, out: Path) -> None:
    out.write_text(page(answers(view)))


def make_app(view: RunView) -> web.Application:
    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page(), content_type="text/html")

    def endpoint(fn: Any) -> Any:
        async def handle(request: web.Request) -> web.Response:
            try:
                return web.json_response(fn(*request.match_info.values()), dumps=json_line)
            except KeyError as e:  # an episode this run does not have
                return web.json_response({"error": str(e.args[0])}, status=404)

        return handle

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/run", endpoint(view.run))
    app.router.add_get("/api/steps", endpoint(view.steps))
    app.router.add_get("/api/episodes", endpoint(view.episodes))
    app.router.add_get("/api/prompts", endpoint(view.prompts))
    # an id may hold "/" (a branch: <trunk id>/b<i>)
    app.router.add_get("/api/episode/{episode_id:.+}", endpoint(view.episode))
    app.router.add_get("/api/compare/{episode_id:.+}", endpoint(view.compare))
    return app


def serve(view: RunView, host: str, port: int) -> None:
    print(f"viewing {view.run_dir} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    web.run_app(make_app(view), host=host, port=port, print=None)
