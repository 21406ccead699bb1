"""The grammar of tool calls: what each tool_choice lets a model write, fed through a real
llguidance matcher token by token, for a vocabulary that spells the call markers in bytes
(SmolLM2's case) and one that has them as tokens (Qwen2.5's)."""

from __future__ import annotations

from typing import Any

import llguidance
import pytest

from reame_core.errors import RequestError
from reame_core.request import GenerationRequest
from reame_core.tools import CALL_CLOSE, CALL_OPEN, FunctionTool, ToolUse, call_text
from reame_suggeritore.tools import tool_grammar

WEATHER = FunctionTool(
    "weather",
    "The forecast for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
CLOCK = FunctionTool("clock")  # no parameters
ROME = call_text("weather", {"city": "Rome", "unit": "celsius"})
OSLO = call_text("weather", {"city": "Oslo", "days": 3, "unit": "fahrenheit"})
TIME = call_text("clock", {})


class Vocabulary:
    """A byte-level vocabulary in the shape llguidance reads (`TokenizerWrapper`): bytes
    0-255, an end-of-sequence token, and, with `marker_tokens`, the call markers as special
    tokens, as Qwen2.5 has them."""

    is_tokenizer_wrapper = True

    def __init__(self, marker_tokens: bool) -> None:
        self.markers = {CALL_OPEN: 257, CALL_CLOSE: 258} if marker_tokens else {}
        self.tokens = [bytes([byte]) for byte in range(256)] + [b"</s>"]
        self.tokens += [marker.encode() for marker in self.markers]
        self.special_token_ids = list(range(256, len(self.tokens)))
        self.eos_token_id = 256
        self.bos_token_id = None

    def __call__(self, text: str) -> list[int]:
        tokens: list[int] = []
        while text:
            marker = next((m for m in self.markers if text.startswith(m)), None)
            if marker is not None:
                tokens.append(self.markers[marker])
                text = text[len(marker) :]
            else:
                tokens.extend(text[0].encode())
                text = text[1:]
        return tokens


@pytest.fixture(params=[False, True], ids=["markers-as-text", "markers-as-tokens"])
def vocabulary(request: pytest.FixtureRequest) -> Vocabulary:
    return Vocabulary(marker_tokens=request.param)


def asking(**tool_use: Any) -> GenerationRequest:
    return GenerationRequest([1], tools=ToolUse((WEATHER, CLOCK), **tool_use))


def accepts(request: GenerationRequest, vocabulary: Vocabulary, text: str) -> bool:
    """Whether a matcher for `request` takes `text`, token by token, and may then end."""
    tokenizer = llguidance.LLTokenizer(vocabulary)  # type: ignore[arg-type]
    grammar = tool_grammar(request, tokenizer)
    assert grammar is not None
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    return matcher.consume_tokens(vocabulary(text)) and matcher.is_accepting()


def test_no_tools_and_no_calls_need_no_grammar() -> None:
    assert tool_grammar(GenerationRequest([1])) is None
    assert tool_grammar(asking(choice="none")) is None


@pytest.mark.parametrize(
    "text",
    ["", "It is sunny.", ROME, f"Let me look.\n{ROME}", f"{ROME}\n{OSLO}\n{TIME}"],
    ids=["nothing", "text", "a call", "text then a call", "three calls"],
)
def test_auto_takes_text_or_calls(vocabulary: Vocabulary, text: str) -> None:
    assert accepts(asking(), vocabulary, text)


@pytest.mark.parametrize(
    "text",
    [
        f"{CALL_OPEN} is how calls start",
        f"{ROME}\nAnd then some text.",
        f"{ROME}\n\n{OSLO}",
        call_text("weather", {"city": "Rome"}),
        call_text("weather", {"city": "Rome", "unit": "kelvin"}),
        call_text("weather", {"city": "Rome", "days": 9, "unit": "celsius"}),
        call_text("weather", {"city": "Rome", "unit": "celsius", "wind": True}),
        call_text("weather", {"city": "R" * 21, "unit": "celsius"}),
        call_text("clock", {"now": 1}),
        call_text("radio", {}),
        ROME.replace('"city": "Rome"', '"city":"Rome"'),
        ROME.replace("{", "{ ", 1),
    ],
    ids=[
        "marker in text",
        "text after a call",
        "blank line between calls",
        "required argument missing",
        "value outside its enum",
        "integer above its maximum",
        "property the schema forbids",
        "string over maxLength",
        "argument to a function without parameters",
        "unknown function",
        "other spacing",
        "space after the brace",
    ],
)
def test_auto_refuses_what_is_not_a_valid_call(vocabulary: Vocabulary, text: str) -> None:
    assert not accepts(asking(), vocabulary, text)


def test_required_takes_calls_only(vocabulary: Vocabulary) -> None:
    required = asking(choice="required")
    assert accepts(required, vocabulary, ROME)
    assert accepts(required, vocabulary, f"{ROME}\n{TIME}")
    assert not accepts(required, vocabulary, "It is sunny.")
    assert not accepts(required, vocabulary, "")
    assert not accepts(required, vocabulary, f"Let me look.\n{ROME}")


def test_without_parallel_calls_one_call_is_the_most(vocabulary: Vocabulary) -> None:
    assert accepts(asking(choice="required", parallel=False), vocabulary, ROME)
    assert not accepts(asking(choice="required", parallel=False), vocabulary, f"{ROME}\n{OSLO}")
    assert accepts(asking(parallel=False), vocabulary, f"Let me look.\n{ROME}")
    assert not accepts(asking(parallel=False), vocabulary, f"{ROME}\n{OSLO}")


def test_a_named_function_is_called_exactly_once(vocabulary: Vocabulary) -> None:
    named = asking(choice="required", only="clock")
    assert accepts(named, vocabulary, TIME)
    assert not accepts(named, vocabulary, ROME)
    assert not accepts(named, vocabulary, f"{TIME}\n{TIME}")
    assert not accepts(named, vocabulary, "It is noon.")


def test_marker_tokens_are_the_only_way_to_open_a_call() -> None:
    """Where the vocabulary has the marker as a token, text spelling it is not a call."""
    vocabulary = Vocabulary(marker_tokens=True)
    tokenizer = llguidance.LLTokenizer(vocabulary)  # type: ignore[arg-type]
    grammar = tool_grammar(asking(choice="required"), tokenizer)
    assert grammar is not None
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    spelled = list(CALL_OPEN.encode())
    assert matcher.validate_tokens(spelled) == 0
    assert matcher.validate_tokens([257]) == 1


def test_forced_text_after_the_marker_names_the_function(vocabulary: Vocabulary) -> None:
    """With one function to call, the grammar leaves nothing to choose up to its arguments:
    what a forced-token draft proposes."""
    tokenizer = llguidance.LLTokenizer(vocabulary)  # type: ignore[arg-type]
    grammar = tool_grammar(asking(choice="required", only="weather"), tokenizer)
    assert grammar is not None
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    forced = tokenizer.decode_str(matcher.compute_ff_tokens())
    assert forced.startswith(f'{CALL_OPEN}\n{{"name": "weather", "arguments": {{"city": "')


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    ],
    ids=["unknown type", "unknown format", "dangling reference"],
)
def test_parameters_llguidance_cannot_compile_are_refused_naming_the_tool(
    parameters: dict[str, Any],
) -> None:
    broken = FunctionTool("broken", None, parameters)
    request = GenerationRequest([1], tools=ToolUse((CLOCK, broken)))
    with pytest.raises(RequestError) as refusal:
        tool_grammar(request)
    assert refusal.value.param == "tools[1].function.parameters"
    assert "tools[1].function.parameters" in refusal.value.message


def test_functions_outside_a_named_choice_are_not_compiled() -> None:
    broken = FunctionTool("broken", None, {"type": "object", "properties": {"a": {"type": 5}}})
    request = GenerationRequest([1], tools=ToolUse((CLOCK, broken), "required", "clock"))
    assert tool_grammar(request) is not None


def offering(parameters: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest([1], tools=ToolUse((FunctionTool("f", None, parameters),)))


OPEN_ITEMS = {  # pydantic writes schemas like this: additionalProperties left out
    "type": "object",
    "properties": {
        "lines": {
            "type": "array",
            "items": {"$ref": "#/$defs/Line"},
        }
    },
    "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}}}},
}


def test_objects_hold_only_the_properties_they_name_unless_they_allow_more(
    vocabulary: Vocabulary,
) -> None:
    line = {"lines": [{"sku": "a1"}]}
    assert accepts(offering(OPEN_ITEMS), vocabulary, call_text("f", line))
    assert not accepts(offering(OPEN_ITEMS), vocabulary, call_text("f", {**line, "x": 1}))
    extra_in_item = {"lines": [{"sku": "a1", "x": 1}]}
    assert not accepts(offering(OPEN_ITEMS), vocabulary, call_text("f", extra_in_item))
    free_form = {"type": "object", "properties": {"labels": {"type": "object"}}}
    assert accepts(offering(free_form), vocabulary, call_text("f", {"labels": {"x": 1}}))
    allowed = {**OPEN_ITEMS, "additionalProperties": {"type": "integer"}}
    assert accepts(offering(allowed), vocabulary, call_text("f", {**line, "x": 1}))


def test_the_parts_of_an_all_of_keep_each_others_properties(vocabulary: Vocabulary) -> None:
    parts = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ]
    }
    assert accepts(offering(parts), vocabulary, call_text("f", {"a": 1, "b": 2}))
