"""What a model name means: an alias, ``hf:owner/repo[:file-or-quant]``, or a ``.gguf`` path.

Names are checked here, before anything touches the disk or the network: a repository id or
file name that could climb out of the cache directory (``..``, absolute paths, odd
characters) is refused with a message, and an unknown name gets the closest aliases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reame_core.models.errors import ModelNameError
from reame_core.models.registry import CARDS, ModelCard, closest_aliases

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_QUANT = "Q4_K_M"
HUB_PREFIX = "hf:"

# The hub's own rules for a repo id, plus no leading dot or dash: nothing like "..".
_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_FILE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_QUANT = re.compile(r"[A-Za-z0-9_]{1,32}")
_ALIAS_LIKE = re.compile(r"[a-z0-9][a-z0-9._-]*")
# A parameter count as a name part: 9b, 1.5B, 135m (qwen2.5-9b, llama3:8b, 9b).
_SIZE_PART = re.compile(r"(?:^|[-_.:])\d+(?:\.\d+)?[bm](?=$|[-_.:])", re.IGNORECASE)
_PATH_START = ("/", "./", "../", "~")
_SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
_QUANT_IN_NAME = re.compile(r"(?:^|[-_.])(I?Q\d(?:_[A-Z0-9]+)*|B?F16|F32)(?=[-.]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF shipped inside a Python package: always there, never downloaded."""

    name: str
    card: ModelCard
    package: str
    file: str


@dataclass(frozen=True)
class HubModel:
    """A GGUF in a Hugging Face repository. `file` is None until `quant` is matched
    against the repository's files."""

    name: str
    repo: str
    file: str | None
    quant: str | None
    card: ModelCard | None = None


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path


ModelRef = EmbeddedModel | HubModel | LocalModel


def parse_model_name(name: str | None) -> ModelRef:
    """Turn a name from the command line or the settings into a `ModelRef`."""
    name = (name or DEFAULT_MODEL).strip()
    card = CARDS.get(name.lower())
    if card is not None:
        if card.embedded is not None:
            package, file = card.embedded
            return EmbeddedModel(card.alias, card, package, file)
        return HubModel(card.alias, card.repo, card.file, card.quant, card)
    if name.startswith(HUB_PREFIX):
        return _parse_hub_reference(name)
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        return LocalModel(path.stem, path)
    raise ModelNameError(_unknown_name_message(name))


def looks_like_model_name(word: str) -> bool:
    """Whether a command-line word is meant as a model name, known or not.

    A model name is one word without spaces: an alias or a near miss of one, ``hf:...``, a
    path, a ``.gguf`` file, a Hugging Face repository with GGUF in its name, or a name with
    a parameter count (``qwen2.5-9b``, ``llama3:8b``). Such a word that names nothing must
    get suggestions rather than be answered as a prompt.
    """
    if not word or any(char.isspace() for char in word):
        return False
    return (
        word.lower() in CARDS
        or word.startswith((HUB_PREFIX, *_PATH_START))
        or word.endswith(".gguf")
        or bool(_SIZE_PART.search(word))
        or (bool(_REPO.fullmatch(word)) and "gguf" in word.lower())
        or (bool(_ALIAS_LIKE.fullmatch(word)) and bool(closest_aliases(word, limit=1, cutoff=0.8)))
    )


def hub_name(repo: str, file: str) -> str:
    """The ``hf:`` name of a hub file, as `reame ls` shows files no alias points to."""
    return f"{HUB_PREFIX}{repo}:{file}"


def _parse_hub_reference(name: str) -> HubModel:
    body = name[len(HUB_PREFIX) :]
    repo, _, selector = body.partition(":")
    if not _REPO.fullmatch(repo) or ".." in repo or "--" in repo:
        raise ModelNameError(
            f"{name!r} is not a valid hub reference: expected hf:owner/repo[:file-or-quant], "
            "with letters, digits, '.', '_' and '-' in owner and repo."
        )
    if not selector:
        return HubModel(name, repo, None, DEFAULT_QUANT)
    if selector.endswith(".gguf"):
        parts = selector.split("/")
        if not all(_FILE_PART.fullmatch(part) for part in parts):
            raise ModelNameError(
                f"{selector!r} is not a valid file name in a repository: use a relative path "
                "without '..', with letters, digits, '.', '_', '+' and '-'."
            )
        return HubModel(name, repo, selector, None)
    if not _QUANT.fullmatch(selector):
        raise ModelNameError(
            f"{selector!r} is neither a .gguf file name nor a quantization such as Q4_K_M."
        )
    return HubModel(name, repo, None, selector.upper())


def _unknown_name_message(name: str) -> str:
    close = [f"{HUB_PREFIX}{name}"] if _REPO.fullmatch(name) else closest_aliases(name)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return (
        f"Unknown model {name!r}.{hint} Use an alias (`reame ls --all` lists them), "
        "hf:owner/repo[:file-or-quant], or a path to a .gguf file."
    )


def quant_of(file: str) -> str:
    """The quantization a GGUF file name announces (``Q4_K_M``), or "?" if none."""
    name = _SPLIT_PART.sub(".gguf", file.rsplit("/", 1)[-1]).removesuffix(".gguf")
    found = _QUANT_IN_NAME.findall(name)
    return found[-1].upper() if found else "?"


def match_quant(files: list[str], quant: str, repo: str) -> str | None:
    """The one single-file GGUF of `files` in quantization `quant`; None if there is none.

    A quantization split into parts (``-00001-of-00002.gguf``) is refused: llama.cpp could
    load it, but Reame downloads and verifies single files.
    """
    matches = [f for f in files if f.endswith(".gguf") and quant_of(f) == quant.upper()]
    whole = [f for f in matches if not _SPLIT_PART.search(f)]
    if len(whole) == 1:
        return whole[0]
    if len(whole) > 1:
        raise ModelNameError(
            f"{repo} has several {quant} files ({', '.join(whole)}); name one: hf:{repo}:{whole[0]}"
        )
    if matches:
        raise ModelNameError(
            f"{repo} splits its {quant} model into parts ({matches[0]} ...); Reame needs a "
            "single-file GGUF: pick another quantization or repository."
        )
    return None


def is_split_part(file: str) -> bool:
    return bool(_SPLIT_PART.search(file))
