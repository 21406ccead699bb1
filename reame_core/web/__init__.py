"""The web page `reame serve` shows at `/`: a chat with the served model, and the server's
status, both built on the public API (`/v1/chat/completions`, `/status`).

Plain HTML, CSS and JavaScript modules in `static/`, served by Reame itself: no build step,
no CDN, so the page works on a network without the internet.
"""
