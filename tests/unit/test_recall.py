"""Which requests alone fix their answer, and the key that names everything it depends on."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.engine.recall import answer_key, recallable
from reame_core.hooktypes import CandidatePlan
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.tools import FunctionTool, ToolUse

INFO = FakeBackend().info
SCHEMA = {"response_format": {"type": "json_object"}}


def asked(prompt: tuple[int, ...] = (1, 2, 3), **fields: Any) -> GenerationRequest:
    params = SamplingParams(**fields.pop("params", {}))
    return GenerationRequest(list(prompt), params, **fields)


def test_the_same_request_gets_the_same_key_whatever_its_id_or_session() -> None:
    one = asked(extensions=SCHEMA, session_id="a")
    other = asked(extensions=dict(SCHEMA), session_id="b")

    assert one.request_id != other.request_id
    assert answer_key(one, INFO) == answer_key(other, INFO) is not None


@pytest.mark.parametrize(
    "changed",
    [
        {"prompt": (1, 2, 4)},
        {"params": {"max_tokens": 7}},
        {"params": {"stop": ("x",)}},
        {"params": {"temperature": 0.5, "seed": 1}},
        {"extensions": {"response_format": {"type": "text"}}},
        {"tools": ToolUse((FunctionTool("f", "", {"type": "object"}),))},
    ],
    ids=["prompt", "max_tokens", "stop", "sampling", "schema", "tools"],
)
def test_anything_the_answer_depends_on_changes_the_key(changed: dict[str, Any]) -> None:
    assert answer_key(asked(**changed), INFO) != answer_key(asked(), INFO)


def test_another_model_configuration_is_another_key() -> None:
    other = dataclasses.replace(INFO, fingerprint="another")

    assert answer_key(asked(), other) != answer_key(asked(), INFO)


def test_a_field_with_no_stable_description_gives_no_key() -> None:
    assert answer_key(asked(extensions={"odd": object()}), INFO) is None


@pytest.mark.parametrize(
    ("fields", "plan", "expected"),
    [
        ({}, None, True),
        ({"params": {"temperature": 0.7, "seed": 3}}, None, True),
        ({"params": {"temperature": 0.7}}, None, False),
        ({"params": {"temperature": 0.7, "seed": -1}}, None, False),
        ({"params": {"logprobs": 1}}, None, False),
        ({"n": 2}, None, False),
        ({}, CandidatePlan(candidates=3), False),
    ],
    ids=["greedy", "seeded", "unseeded", "random-seed", "logprobs", "n2", "plan"],
)
def test_only_requests_that_fix_their_answer_are_recallable(
    fields: dict[str, Any], plan: CandidatePlan | None, expected: bool
) -> None:
    assert recallable(asked(**fields), plan) is expected
