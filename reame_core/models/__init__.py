"""Model names to model files: the alias registry, the Hugging Face cache, local files.

`registry` knows the models Reame is for, `names` parses what the user typed, `hub` talks to
the Hugging Face Hub through huggingface_hub, `ledger` remembers use and verification, and
`store` puts them together. Nothing here loads a model: that is the backend's job.
"""

from __future__ import annotations

from reame_core.models.names import DEFAULT_MODEL, looks_like_model_name, parse_model_name
from reame_core.models.store import ModelStore, ResolvedModel
from reame_core.settings import default_cache_dir

__all__ = [
    "DEFAULT_MODEL",
    "ModelStore",
    "ResolvedModel",
    "looks_like_model_name",
    "parse_model_name",
    "resolve_model",
]


def resolve_model(name: str | None, store: ModelStore | None = None) -> ResolvedModel:
    """The file for a model name, downloading a hub model on first use. For tests and
    benchmarks: unlike a run, it does not count as a use of the model."""
    store = store or ModelStore.in_cache_dir(default_cache_dir())
    return store.resolve(name, record_use=False)
