"""Model files on the Hugging Face Hub, through huggingface_hub and its standard cache.

Downloads go through `hf_hub_download`: it writes to a temporary file and renames it into
the cache only once the expected size arrived, resumes a transfer that breaks off (HTTP
Range) and shows a progress bar. On top of that this module checks free disk space before a
download, checks the bytes against the hub's checksum afterwards (`content_matches_address`),
and turns the library's exceptions into messages that say what to do.

The environment is read when a command runs, with huggingface_hub's meaning: HF_HOME and
HF_HUB_CACHE (where), HF_ENDPOINT (which hub), HF_HUB_OFFLINE (no network), HF_TOKEN (read by
huggingface_hub itself). This module never deletes anything outside that cache.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import (
    CachedFileInfo,
    HfApi,
    hf_hub_download,
    scan_cache_dir,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    CacheNotFound,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import DryRunFileInfo, repo_folder_name
from huggingface_hub.utils.tqdm import tqdm

from reame_core.autoconfig.facts import free_disk_bytes
from reame_core.errors import ReameError
from reame_core.models.errors import ModelDownloadError, ModelNotDownloadedError

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "ON", "YES", "TRUE"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubConfig:
    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_environment(cls) -> HubConfig:
        env = os.environ
        xdg_cache = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        hf_home = env.get("HF_HOME") or os.path.join(xdg_cache, "huggingface")
        cache_dir = env.get("HF_HUB_CACHE") or os.path.join(hf_home, "hub")
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            cache_dir=Path(os.path.expandvars(cache_dir)).expanduser(),
            offline=env.get("HF_HUB_OFFLINE", "").upper() in _TRUE,
        )

    def repo_dir(self, repo: str) -> Path:
        return self.cache_dir / repo_folder_name(repo_id=repo, repo_type="model")


@dataclass(frozen=True)
class Download:
    path: Path
    size: int
    transferred: bool


@dataclass(frozen=True)
class CachedHubFile:
    repo: str
    file: str
    path: Path


def cached_file(hub: HubConfig, repo: str, file: str) -> Path | None:
    """The file of the latest pulled revision, if it is in the cache. No network."""
    found = try_to_load_from_cache(repo, file, cache_dir=hub.cache_dir)
    return Path(found) if isinstance(found, str) else None


def cached_repo_files(hub: HubConfig, repo: str) -> list[str]:
    """Files of the latest pulled revision of a repository in the cache. No network."""
    ref = hub.repo_dir(repo) / "refs" / "main"
    try:
        snapshot = hub.repo_dir(repo) / "snapshots" / ref.read_text().strip()
    except OSError:
        return []
    return sorted(
        path.relative_to(snapshot).as_posix() for path in snapshot.rglob("*") if path.is_file()
    )


def remote_repo_files(hub: HubConfig, repo: str, label: str) -> list[str]:
    """Files of a repository on the hub."""
    try:
        return HfApi(endpoint=hub.endpoint).list_repo_files(repo)
    except (OSError, httpx2.HTTPError) as error:
        raise _hub_error(error, hub, label, repo, None) from error


def download(
    hub: HubConfig, repo: str, file: str, label: str, progress_bar: type[tqdm] | None = None
) -> Download:
    """Make sure `file` of `repo` is in the cache, downloading it if it is missing or
    changed on the hub. Offline, a cached file is returned as it is. The progress bar is
    huggingface_hub's (size, speed, ETA; shown on a terminal) unless `progress_bar` is given."""
    try:
        plan = hf_hub_download(
            repo,
            file,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            local_files_only=hub.offline,
            dry_run=True,
        )
        assert isinstance(plan, DryRunFileInfo)
        size = plan.file_size or 0
        if plan.will_download and size:
            free = free_disk_bytes(hub.cache_dir)
            if free < size:
                raise ModelDownloadError(
                    f"{label} needs {size / 1e9:.2f} GB but only {free / 1e9:.2f} GB is free "
                    f"in {hub.cache_dir}; free some space or set HF_HUB_CACHE to a larger disk."
                )
        path = Path(
            hf_hub_download(
                repo,
                file,
                cache_dir=hub.cache_dir,
                endpoint=hub.endpoint,
                local_files_only=hub.offline,
                tqdm_class=progress_bar,
            )
        )
    except (OSError, httpx2.HTTPError) as error:
        # huggingface_hub's own errors are OSErrors too (HfHubHTTPError, LocalEntryNotFoundError).
        raise _hub_error(error, hub, label, repo, file) from error
    return Download(path, path.stat().st_size, plan.will_download)


def content_matches_address(path: Path) -> bool | None:
    """Whether a cached file's bytes hash to the name of its blob, which the hub's ETag set:
    the sha256 of the content for LFS files (every GGUF), a git blob id for small ones.
    None when the cache keeps no such name (a copy instead of a symlink to a blob)."""
    blob = path.resolve()
    address = blob.name
    if _SHA256.fullmatch(address):
        digest = hashlib.sha256()
    elif _GIT_SHA1.fullmatch(address):
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(b"blob %d\0" % blob.stat().st_size)
    else:
        return None
    with blob.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == address


def cached_gguf_files(hub: HubConfig) -> list[CachedHubFile]:
    """Every GGUF file in the cache, the latest revision of each (repo, file) once."""
    try:
        info = scan_cache_dir(hub.cache_dir)
    except CacheNotFound:
        return []
    newest: dict[tuple[str, str], tuple[float, CachedHubFile]] = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            snapshot = repo.repo_path / "snapshots" / revision.commit_hash
            for cached in revision.files:
                file = cached.file_path.relative_to(snapshot).as_posix()
                if not file.endswith(".gguf"):
                    continue
                entry = CachedHubFile(repo.repo_id, file, cached.file_path)
                key = (repo.repo_id, file)
                if key not in newest or newest[key][0] < revision.last_modified:
                    newest[key] = (revision.last_modified, entry)
    return [entry for _, entry in newest.values()]


def remove_cached(hub: HubConfig, repo: str, file: str) -> int:
    """Delete every cached revision of one file of a repository; the whole repository folder
    goes too once nothing else of it is cached. Returns the bytes freed."""
    try:
        info = scan_cache_dir(hub.cache_dir)
    except CacheNotFound:
        return 0
    for cached_repo in info.repos:
        if cached_repo.repo_id != repo or cached_repo.repo_type != "model":
            continue
        chosen: list[CachedFileInfo] = []
        others: list[CachedFileInfo] = []
        for revision in cached_repo.revisions:
            snapshot = cached_repo.repo_path / "snapshots" / revision.commit_hash
            for cached in revision.files:
                same = cached.file_path.relative_to(snapshot).as_posix() == file
                (chosen if same else others).append(cached)
        if not chosen:
            return 0
        if others:
            strategy = info.delete_files(*chosen)
        else:
            strategy = info.delete_revisions(*(r.commit_hash for r in cached_repo.revisions))
        try:
            strategy.execute()
        except OSError as error:
            raise ReameError(
                f"Could not remove {file} from {hub.cache_dir}: {error.strerror or error}"
            ) from error
        return strategy.expected_freed_size
    return 0


def _hub_error(
    error: OSError | httpx2.HTTPError, hub: HubConfig, label: str, repo: str, file: str | None
) -> ReameError:
    """One readable sentence for whatever huggingface_hub or the file system raised."""
    where = hub.repo_dir(repo)
    what = f"{repo}/{file}" if file else repo
    if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        reason = (
            "offline mode is on (HF_HUB_OFFLINE)"
            if hub.offline
            else f"{hub.endpoint} could not be reached"
        )
        return ModelNotDownloadedError(
            f"{label} is not downloaded and {reason}; looked in {where}. "
            f"Run `reame pull {label}` with the network on."
        )
    if isinstance(error, GatedRepoError):
        return ModelDownloadError(
            f"{repo} is gated: accept its terms on the hub, then set HF_TOKEN to a token of "
            "that account."
        )
    if isinstance(error, RepositoryNotFoundError):
        return ModelDownloadError(
            f"{repo} was not found on {hub.endpoint} (a private repository needs HF_TOKEN)."
        )
    if isinstance(error, RemoteEntryNotFoundError):
        return ModelDownloadError(f"{repo} has no file {file!r} on {hub.endpoint}.")
    if isinstance(error, RevisionNotFoundError):
        return ModelDownloadError(f"{repo} has no 'main' revision on {hub.endpoint}.")
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "an error"
        return ModelDownloadError(f"The hub answered {status} for {what}.")
    if isinstance(error, httpx2.HTTPError):
        return ModelDownloadError(
            f"The download of {label} broke off ({type(error).__name__}: {error}); nothing "
            f"partial was kept. Run `reame pull {label}` again."
        )
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return ModelDownloadError(
            f"No space left in {hub.cache_dir} for {label}; free some space or set "
            "HF_HUB_CACHE to a larger disk."
        )
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ModelDownloadError(
            f"Cannot write to the Hugging Face cache {hub.cache_dir} "
            f"({error.strerror}); set HF_HOME or HF_HUB_CACHE to a writable directory."
        )
    if "Consistency check failed" in str(error):
        return ModelDownloadError(
            f"The download of {label} came out the wrong size; nothing partial was "
            f"kept. Run `reame pull {label}` again."
        )
    return ModelDownloadError(f"Could not download {label}: {error}")
