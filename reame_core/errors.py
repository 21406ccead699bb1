"""Errors a user can act on. Each maps onto an OpenAI-shaped error in the API."""

from __future__ import annotations


class ReameError(Exception):
    """Base of Reame's own errors."""


class RequestError(ReameError):
    """A request that cannot be served as asked; `param` names the offending field."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ContextOverflowError(RequestError):
    """The prompt plus the requested tokens do not fit a sequence's context."""

    def __init__(self, message: str, *, param: str | None = "prompt") -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class SettingsError(ReameError):
    """Settings that cannot be honoured as given (a file they name that cannot be read)."""


class ModelLoadError(ReameError):
    """The model file is missing, unreadable or not a model llama.cpp can load."""


class BuildCannotRunError(ReameError):
    """The installed llama.cpp build cannot decode on this CPU (it crashed, hung or failed
    in a check run in a child process); the message says what happened and how to fix it."""
