"""`reame run --json-schema FILE | --grammar FILE | --regex PATTERN`: structured output from
the command line, set as the request fields the API takes (`reame_add_request_options`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_request_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("structured output")
    group.add_argument(
        "--json-schema",
        dest="extensions.json_schema",
        type=_json_file,
        metavar="FILE",
        help="answer with JSON that follows the JSON schema in FILE",
    )
    group.add_argument(
        "--grammar",
        dest="extensions.grammar",
        type=_text_file,
        metavar="FILE",
        help="answer with text that follows the GBNF grammar in FILE",
    )
    group.add_argument(
        "--regex",
        dest="extensions.regex",
        metavar="PATTERN",
        help="answer with text that matches the regular expression PATTERN",
    )


def _text_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error}") from None


def _json_file(path: str) -> Any:
    try:
        return json.loads(_text_file(path))
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {error}") from None
