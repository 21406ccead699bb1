"""Errors about model names and files, each worded so the user knows what to do next."""

from __future__ import annotations

from reame_core.errors import ModelLoadError, ReameError


class ModelNameError(ModelLoadError):
    """A name that is no alias, no valid ``hf:`` reference and no ``.gguf`` path."""


class ModelNotDownloadedError(ModelLoadError):
    """The model is not in the cache and may not (offline) or could not be downloaded."""


class ModelDownloadError(ReameError):
    """A download failed: the hub refused, the transfer broke, the bytes were wrong, or the
    disk could not take them. Nothing partial is left where it could pass for complete."""
