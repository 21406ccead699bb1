"""Reame's settings: one model, read from defaults < TOML file < env ``REAME_*`` < CLI flags.

No file is needed. The TOML file is ``--config PATH`` or ``REAME_CONFIG``; each plugin keeps
its options in its own table (``[plugins.NAME]``) and validates them with its own model
through `Settings.plugin_section`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, PrivateAttr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from reame_core.environment import variable_set
from reame_core.errors import SettingsError

SectionT = TypeVar("SectionT", bound=BaseModel)

_CONFIG_ENV = "REAME_CONFIG"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REAME_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        # An error names the setting and what is wrong with it, never the value: some are
        # API keys.
        hide_input_in_errors=True,
    )

    model: str = Field(
        "smollm2-135m", description="Model alias, hf:owner/repo[:file-or-quant], or .gguf path."
    )
    # None: host auto-configuration decides (reame_core.autoconfig), and says why.
    threads: int | None = Field(None, ge=1, description="CPU threads; default: physical cores.")
    ctx: int | None = Field(
        None, ge=64, description="Context length of each sequence slot; default: from RAM."
    )
    parallel: int | None = Field(
        None, ge=1, le=64, description="Sequence slots decoded together; default: from RAM."
    )
    kv_type: Literal["f16", "q8_0"] | None = Field(
        None,
        description="KV cache type of keys and values; default: q8_0 keys and f16 values "
        "when deterministic (f16 keys turn flash attention off), f16 otherwise; q8_0 values "
        "when memory is tight.",
    )
    batch: int | None = Field(
        None, ge=16, description="Most tokens in one decode step (n_batch); default: 512."
    )
    weights: Literal["read", "mapped"] | None = Field(
        None,
        description="How the model's weights are held: read into memory (in huge pages where "
        "the host gives them: faster decoding) or mapped from the file (the kernel pages them "
        "in and out, and processes mapping one file share it); default: read where the model "
        "is at most 512 MiB, fits in memory and the host has huge pages.",
    )
    prefill_chunk: int = Field(
        128,
        ge=1,
        description="Most prompt tokens per step: streams keep decoding beside a long prompt, "
        "and a request arriving meanwhile starts after one chunk, not the whole prompt.",
    )
    deterministic: bool = Field(
        True,
        description="Per-sequence KV, and attention along one path (q8_0 keys): a "
        "request's tokens depend neither on its batch neighbours, on cache hits, nor on the "
        "thread count.",
    )
    adapt_threads: bool = Field(
        True,
        description="Decode with fewer threads while other processes keep the cores busy, "
        "and with `threads` again once they are quiet.",
    )
    speculate: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Speculative decoding: auto lets the governor decide where it pays; on "
        "verifies every draft; off never drafts. A request may override it.",
    )
    draft_max: int = Field(32, ge=0, le=64, description="Most draft tokens per sequence and step.")
    draft_model: str | None = Field(
        None,
        description="Smaller model of the same vocabulary that drafts for the target "
        "(alias, hf: reference or .gguf path; auto: the partner the model's alias names).",
    )
    disable_plugins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    log_json: bool = False
    log_prompts: bool = Field(
        False, description="Log each API request's prompt and outputs (never logged otherwise)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys the API accepts (none: open API)."
    )
    # The environment's spelling of the `--api-key` flag; without this field REAME_API_KEY
    # would be ignored, and the server open.
    api_key: str | None = Field(None, description="One more bearer key the API accepts.")
    api_key_file: Path | None = Field(None, description="File with one API key per line.")
    max_queue: int = Field(64, ge=0, description="Requests waiting beyond the busy slots.")
    max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest request body accepted.")
    drain_seconds: int = Field(
        30,
        ge=0,
        description="On SIGTERM or Ctrl-C, how long the requests in flight may take to finish "
        "(new connections are refused meanwhile) before they are cut and the server exits.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins allowed by CORS (none: CORS off)."
    )
    max_sessions: int | None = Field(
        None, ge=0, description="Sessions whose KV stays pinned (default: half the slots)."
    )
    sessions_first: bool = Field(
        True,
        description="Admit a waiting conversation turn (a request naming its session) "
        "before waiting requests that name none.",
    )
    web: bool = Field(
        True, description="Serve the web page at / (a chat with the model, and the status)."
    )
    cache_dir: Path | None = Field(
        None,
        description="Reame's own files: model records and the plugins' disk caches "
        "(default: $XDG_CACHE_HOME/reame, else ~/.cache/reame).",
    )

    # Defaults that host auto-configuration offers the plugin sections; see `plugin_section`.
    _plugin_defaults: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    @field_validator("disable_plugins", "api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_were_given(cls, value: Any) -> Any:
        # "" or " , " is a key that went missing (an unset shell variable), not a wish for
        # an open API: the way to run without keys is to set none.
        if isinstance(value, str) and not value.strip(" ,"):
            raise ValueError("it is set but holds no key; leave it unset to run without keys")
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_are_sendable(cls, keys: list[str]) -> list[str]:
        return [_checked_key(key) for key in keys]

    @field_validator("api_key")
    @classmethod
    def _key_is_sendable(cls, key: str | None) -> str | None:
        return None if key is None else _checked_key(key)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(_CONFIG_ENV)
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> Settings:
        """Build settings; `overrides` (CLI flags) win, None values are ignored."""
        flags = {key: value for key, value in overrides.items() if value is not None}
        if config_file is None:
            return cls(**flags)
        with variable_set(_CONFIG_ENV, str(config_file)):
            return cls(**flags)

    def all_api_keys(self) -> list[str]:
        """Keys from settings and from `api_key_file` (blank lines and # comments skipped).

        A key file that cannot be read or holds no key stops the server from starting: it
        was meant to guard the API, and must not leave it open."""
        keys = [*self.api_keys, *([self.api_key] if self.api_key is not None else [])]
        if self.api_key_file is None:
            return keys
        path = self.api_key_file
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"The API key file {path} cannot be read: {error}") from None
        found = [line.strip() for line in lines]
        found = [line for line in found if line and not line.startswith("#")]
        if not found:
            raise SettingsError(
                f"The API key file {path} holds no key (one per line; blank lines and "
                "# comments are skipped)."
            )
        try:
            return keys + [_checked_key(key) for key in found]
        except ValueError as error:
            raise SettingsError(f"The API key file {path}: {error}.") from None

    def plugin_section(self, name: str, model: type[SectionT]) -> SectionT:
        """This plugin's own settings, validated by the plugin's model.

        Auto-configured defaults (the disk budget the host plan computed from the plugin's
        `DiskNeed`) fill the keys the plugin's model declares and the settings leave unset;
        others are not offered, so a plugin opts in by declaring the field.
        """
        defaults = {
            key: value
            for key, value in self._plugin_defaults.get(name, {}).items()
            if key in model.model_fields
        }
        return model.model_validate({**defaults, **self.plugins.get(name, {})})

    def with_plugin_defaults(self, defaults: dict[str, dict[str, Any]]) -> Settings:
        """A copy whose plugin sections fall back on `defaults`."""
        copy = self.model_copy()
        copy._plugin_defaults = {name: dict(values) for name, values in defaults.items()}
        return copy

    @property
    def cache_path(self) -> Path:
        return self.cache_dir.expanduser() if self.cache_dir else default_cache_dir()


def _checked_key(key: str) -> str:
    """A bearer key without its surrounding blanks, if a client can send it in a header:
    printable ASCII, not empty."""
    key = key.strip()
    if not key:
        raise ValueError("an API key is empty; leave the keys unset to run without keys")
    if not all(" " <= char <= "~" for char in key):
        raise ValueError("an API key holds a character other than printable ASCII")
    return key


def default_cache_dir() -> Path:
    """Where Reame keeps its own files when `cache_dir` is not set."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "reame"
