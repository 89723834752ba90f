"""The run viewer: ``python -m areal.view RUN_DIR`` (``__main__.py``).

data.py     the run directory read back: steps, episodes, conversation trees, tokens
server.py   aiohttp: the page and its JSON endpoints; the static export (--html)
page.html, page.css, page.js   the page (plain HTML, CSS and JS; nothing from a CDN)
"""
