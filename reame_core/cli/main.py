"""The `reame` command: run, serve, pull, ls, rm, config, doctor, plugins, bench, speculation,
and the commands plugins add.

Flags are turned into `Settings` overrides (flags win over env and the config file); the
subcommands then start the same runtime the server uses. Plugins add flags for their own
settings (hook `reame_add_options`), flags of `reame run` for the request fields they claim
(hook `reame_add_request_options`) and whole commands (hook `reame_add_commands`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from reame_core.errors import ReameError
from reame_core.logs import configure_logging
from reame_core.models import DEFAULT_MODEL, looks_like_model_name, parse_model_name
from reame_core.models.errors import ModelNameError
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

PLUGIN_SETTING = "plugins."  # prefix of the `dest` of a flag that sets a plugin's setting
REQUEST_FIELD = "extensions."  # prefix of the `dest` of a flag that sets a request field


def _settings_flags(parser: argparse.ArgumentParser, plugins: PluginHost | None) -> None:
    group = parser.add_argument_group("settings")
    group.add_argument("--config", help="TOML settings file (also REAME_CONFIG)")
    group.add_argument("--cache-dir", help="Reame's own files (default: ~/.cache/reame)")
    group.add_argument(
        "--disable-plugin",
        action="append",
        dest="disable_plugins",
        metavar="NAME",
        help="do not load this plugin (repeatable)",
    )
    group.add_argument("--log-json", action="store_true", default=None, help="JSON log lines")
    group.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    if plugins is not None:
        plugins.hook.reame_add_options(parser=parser)


def _engine_flags(parser: argparse.ArgumentParser, plugins: PluginHost | None) -> None:
    group = parser.add_argument_group("model and engine")
    group.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    group.add_argument(
        "--ctx", type=int, help="context length per sequence slot (default: from free RAM)"
    )
    group.add_argument(
        "--parallel", type=int, help="sequence slots decoded together (default: from free RAM)"
    )
    group.add_argument(
        "--kv-type",
        choices=["f16", "q8_0"],
        help="KV cache type (default: q8_0 keys and f16 values; f16 when not deterministic; "
        "q8_0 values when RAM is tight)",
    )
    group.add_argument("--batch", type=int, help="most tokens per decode step")
    group.add_argument(
        "--weights",
        choices=["read", "mapped"],
        help="weights read into memory (huge pages: faster) or mapped from the file "
        "(shared between processes); default: read for a model of at most 512 MiB that fits, "
        "where the host has huge pages",
    )
    group.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bit-identical outputs whatever the batch or cache (default on; "
        "--no-deterministic: unified KV + flash attention, faster, not repeatable)",
    )
    group.add_argument(
        "--adapt-threads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fewer threads while other processes keep the cores busy (default on)",
    )
    group.add_argument(
        "--speculate",
        choices=["auto", "on", "off"],
        help="speculative decoding (default auto: only where it pays)",
    )
    group.add_argument("--draft-max", type=int, help="most draft tokens per sequence and step")
    group.add_argument(
        "--draft-model",
        help="smaller model of the same vocabulary that drafts (auto: the alias's partner)",
    )
    _settings_flags(parser, plugins)


def _fleet_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fleet (Ray Serve; pip install 'reame[ray]')")
    group.add_argument(
        "--ray", action="store_true", help="serve from replicas on a Ray cluster, one API in front"
    )
    group.add_argument("--replicas", type=int, help="replicas (default 2)")
    group.add_argument(
        "--address", help="an existing Ray cluster (default: start one on this machine)"
    )
    group.add_argument(
        "--fleet-dir",
        help="directory every replica shares for the disk prefix cache and the archive "
        "(a shared filesystem across machines)",
    )
    group.add_argument(
        "--router",
        choices=["reame", "pow2", "prefix"],
        help="request router: Reame's cache and session affinity (default), Ray Serve's power "
        "of two choices, or Ray Serve LLM's PrefixCacheAffinityRouter",
    )


def _sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument("--max-tokens", type=int, default=512)
    group.add_argument("--temperature", type=float, help="default 0 (greedy)")
    group.add_argument("--seed", type=int)
    group.add_argument("--system", help="system message")


def build_parser(plugins: PluginHost | None = None) -> argparse.ArgumentParser:
    """The `reame` parser; with `plugins`, also their flags and commands."""
    parser = argparse.ArgumentParser(
        prog="reame", description="LLM inference on cheap CPUs: never compute the same thing twice."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="answer a prompt, or chat",
        description="Answer PROMPT (and/or text piped on stdin) and exit, or open a chat.",
    )
    run.add_argument(
        "words", nargs="*", metavar="[MODEL] [PROMPT]", help=f"model (default {DEFAULT_MODEL})"
    )
    run.add_argument(
        "--explain",
        action="store_true",
        help="print the configuration this run would use, and why, then exit",
    )
    _sampling_flags(run)
    if plugins is not None:
        plugins.hook.reame_add_request_options(parser=run)
    _engine_flags(run, plugins)

    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("model", nargs="?", help=f"model (default {DEFAULT_MODEL})")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8080)")
    serve.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help="accept this bearer key (repeatable; also REAME_API_KEYS=k1,k2)",
    )
    serve.add_argument("--api-key-file", help="file with one accepted key per line")
    serve.add_argument(
        "--max-queue", type=int, help="requests waiting beyond busy slots (429 past it)"
    )
    serve.add_argument("--max-body-bytes", type=int, help="largest request body (413 past it)")
    serve.add_argument(
        "--drain-seconds",
        type=int,
        help="on SIGTERM, how long requests in flight may take to finish (default 30)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        dest="cors_origins",
        metavar="ORIGIN",
        help="allow this origin (repeatable; default: CORS off)",
    )
    serve.add_argument("--max-sessions", type=int, help="conversations whose KV stays pinned")
    serve.add_argument(
        "--sessions-first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="admit waiting conversation turns (requests naming a session) before requests "
        "naming none (default: on; --no-sessions-first: first come, first served)",
    )
    serve.add_argument(
        "--no-web",
        action="store_false",
        dest="web",
        default=None,
        help="do not serve the web page at / (the API stays)",
    )
    serve.add_argument(
        "--log-prompts",
        action="store_true",
        default=None,
        help="log each request's prompt and outputs (never logged otherwise)",
    )
    _fleet_flags(serve)
    _engine_flags(serve, plugins)

    pull = commands.add_parser(
        "pull", help="download a model (or check it is current)", description=_MODEL_NAMES
    )
    pull.add_argument("model", metavar="MODEL")
    _settings_flags(pull, plugins)

    ls = commands.add_parser("ls", help="list downloaded models")
    ls.add_argument(
        "--all", action="store_true", dest="include_available", help="also list known aliases"
    )
    _settings_flags(ls, plugins)

    rm = commands.add_parser("rm", help="delete a downloaded model", description=_MODEL_NAMES)
    rm.add_argument("model", metavar="MODEL")
    _settings_flags(rm, plugins)

    config = commands.add_parser(
        "config", help="show the configuration Reame picks for this host, and why"
    )
    config.add_argument("model", nargs="?", help=f"model (default {DEFAULT_MODEL})")
    _engine_flags(config, plugins)

    doctor = commands.add_parser(
        "doctor",
        help="the llama.cpp build, this CPU, and whether they run together",
        description="Print the llama.cpp build's features, the CPU's, the build check's "
        "verdict and the buffer types the model weights go to. Exits 1 if the build "
        "cannot run on this CPU.",
    )
    doctor.add_argument("model", nargs="?", help=f"model (default {DEFAULT_MODEL})")
    doctor.add_argument(
        "--recheck", action="store_true", help="check the build again, ignoring the cached verdict"
    )
    _settings_flags(doctor, plugins)

    listing = commands.add_parser("plugins", help="list plugins and the hooks they implement")
    _engine_flags(listing, plugins)

    from reame_core.cli.bench import add_parser as add_bench

    _settings_flags(add_bench(commands), plugins)

    speculation = commands.add_parser(
        "speculation", help="what a running server's speculation governor decided, per source"
    )
    speculation.add_argument(
        "--url", default="http://127.0.0.1:8080", help="the server (default %(default)s)"
    )
    speculation.add_argument("--api-key", help="bearer key, if the server wants one")
    if plugins is not None:
        builtin = set(commands.choices)
        plugins.hook.reame_add_commands(commands=commands)
        for name, command in commands.choices.items():
            if name not in builtin:
                _settings_flags(command, plugins)
    return parser


_MODEL_NAMES = (
    "MODEL is an alias (`reame ls --all`), hf:owner/repo[:file-or-quant] for any GGUF on the "
    "Hugging Face Hub (default quantization Q4_K_M), or a path to a .gguf file. Downloads go to "
    "the Hugging Face cache (HF_HOME, HF_HUB_CACHE; HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply)."
)


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    fields = (
        "threads", "ctx", "parallel", "kv_type", "cache_dir", "batch", "weights", "deterministic",
        "adapt_threads", "disable_plugins",
        "log_json", "log_prompts", "log_level", "host", "port", "api_keys", "api_key_file",
        "max_queue", "max_body_bytes", "drain_seconds", "cors_origins", "max_sessions",
        "sessions_first", "speculate",
        "draft_max", "draft_model", "web",
    )  # fmt: skip
    overrides = {name: getattr(args, name, None) for name in fields}
    sections: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if dest.startswith(PLUGIN_SETTING) and value is not None:
            section, _, key = dest.removeprefix(PLUGIN_SETTING).partition(".")
            sections.setdefault(section, {})[key] = value
    overrides["plugins"] = sections or None
    overrides.update(extra)
    return Settings.load(getattr(args, "config", None), **overrides)


def request_extensions(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields set by flags of `reame_add_request_options`."""
    return {
        dest.removeprefix(REQUEST_FIELD): value
        for dest, value in vars(args).items()
        if dest.startswith(REQUEST_FIELD) and value is not None
    }


def split_model_and_prompt(words: Sequence[str]) -> tuple[str | None, str]:
    """`reame run [MODEL] [PROMPT...]`: the first word is the model if it is meant as one.

    A word shaped like a model name that names nothing is an error with suggestions
    (`ModelNameError`), raised before anything loads, rather than a prompt answered by the
    default model.
    """
    if not words or not looks_like_model_name(words[0]):
        return None, " ".join(words)
    try:
        parse_model_name(words[0])
    except ModelNameError as error:
        as_prompt = shlex.join([DEFAULT_MODEL, *words])
        raise ModelNameError(f"{error} To ask it as a prompt: reame run {as_prompt}") from None
    return words[0], " ".join(words[1:])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(PluginHost()).parse_args(argv)
    try:
        handler = getattr(args, "handler", None)
        if handler is not None:  # a command a plugin added
            settings = settings_from(args)
            configure_logging(json=settings.log_json, level=_quiet(settings))
            return int(handler(settings, args))
        if args.command == "run":
            model, prompt = split_model_and_prompt(args.words)
            settings = settings_from(args, model=model)
            configure_logging(json=settings.log_json, level=_quiet(settings))
            if args.explain:
                from reame_core.cli.config import config_command

                return config_command(settings, sys.stdout)
            from reame_core.cli.run import run_command

            return run_command(settings, args, prompt)
        if args.command == "serve":
            settings = settings_from(args, model=args.model)
            configure_logging(
                json=settings.log_json, level=settings.log_level, prompts=settings.log_prompts
            )
            if args.ray:
                return _serve_fleet(settings, args)
            fleet_only = ("replicas", "address", "fleet_dir", "router")
            if any(getattr(args, name) is not None for name in fleet_only):
                raise ReameError("--replicas, --address, --fleet-dir and --router need --ray")
            from reame_core.server.app import serve

            return serve(settings)
        if args.command == "bench":
            from reame_core.cli.bench import bench_command

            settings = settings_from(args, model=args.model)
            configure_logging(json=settings.log_json, level=_quiet(settings))
            return bench_command(settings, args, sys.argv[1:] if argv is None else argv)
        if args.command == "speculation":
            from reame_core.cli.speculation import speculation_command

            return speculation_command(args.url, args.api_key)
        settings = settings_from(args, model=getattr(args, "model", None))
        configure_logging(json=settings.log_json, level=_quiet(settings))
        return _model_command(args, settings)
    except ValidationError as error:
        print(f"reame: invalid settings:\n{error}", file=sys.stderr)
        return 2
    except ReameError as error:
        print(f"reame: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _serve_fleet(settings: Settings, args: argparse.Namespace) -> int:
    try:
        from reame_core.fleet.launch import serve_fleet
    except ImportError as error:
        raise ReameError(
            f"reame serve --ray needs Ray Serve ({error}): pip install 'reame[ray]'"
        ) from None
    from pathlib import Path

    return serve_fleet(
        settings,
        replicas=args.replicas or 2,
        address=args.address,
        fleet_dir=Path(args.fleet_dir).expanduser() if args.fleet_dir else None,
        router=args.router or "reame",
    )


def _model_command(args: argparse.Namespace, settings: Settings) -> int:
    """The commands that manage models or describe the setup rather than run a model."""
    if args.command in ("pull", "ls", "rm"):
        from reame_core.cli import models

        if args.command == "pull":
            return models.pull_command(settings, args.model, sys.stdout)
        if args.command == "rm":
            return models.rm_command(settings, args.model, sys.stdout)
        return models.ls_command(settings, Console(), include_available=args.include_available)
    if args.command == "config":
        from reame_core.cli.config import config_command

        return config_command(settings, sys.stdout)
    if args.command == "doctor":
        from reame_core.cli.doctor import doctor_command

        return doctor_command(settings, sys.stdout, recheck=args.recheck)
    from reame_core.cli.plugins import plugins_command

    return plugins_command(settings)


def _quiet(settings: Settings) -> str:
    """Interactive commands keep the terminal for the answer: warnings and up only."""
    return "warning" if settings.log_level == "info" else settings.log_level


if __name__ == "__main__":
    sys.exit(main())
