"""Proves `reame_check_request`: a request carrying ``refuse`` is refused before it is
queued, and the caller hears the plugin's own message."""

from __future__ import annotations

from collections.abc import Mapping

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.request import GenerationRequest

MESSAGE = "This server's refuse plugin turns down requests that ask for it."


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {"refuse": "ask the refuse plugin to turn this request down"}


@hookimpl
def reame_check_request(request: GenerationRequest, model: ModelInfo) -> None:
    if request.extensions.get("refuse"):
        raise RequestError(MESSAGE, param="refuse")
