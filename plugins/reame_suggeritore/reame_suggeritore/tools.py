"""Tool calls as a grammar: a request's `tools` and `tool_choice` become the grammar its answer
must follow."""

from __future__ import annotations

from reame_core.request import GenerationRequest


def tool_grammar(request: GenerationRequest) -> str | None:
    """The Lark grammar a tool-calling request's answer must follow; None for no constraint."""
    return None
