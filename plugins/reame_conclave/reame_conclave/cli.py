"""`reame run --best-of N [--vote answer=number,rule=window]`: best-of-N voting from the
command line, set as the request fields the API takes (`reame_add_request_options`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_request_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("best-of-N voting")
    group.add_argument(
        "--best-of",
        dest="extensions.best_of",
        type=int,
        metavar="N",
        help="sample N answers and reply with the one most of them agree on",
    )
    group.add_argument(
        "--vote",
        dest="extensions.vote",
        type=vote_options,
        metavar="KEY=VALUE,...",
        help="how the vote reads answers and stops: answer=auto|number|line|text|regex|json, "
        "pattern=..., field=..., rule=adaptive|window|majority|all, confidence=, window=, wave=",
    )


def vote_options(text: str) -> dict[str, Any]:
    """ "answer=number,rule=window,window=3" as the `vote` object (numbers as numbers)."""
    options: dict[str, Any] = {}
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        options[key.strip()] = _number(value.strip())
    return options


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
