"""Tools in the prompt: through a template that renders them (Qwen2.5's), or written into the
system message and the turns for one that does not (ChatML)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reame_core.backend.fake import FakeBackend
from reame_core.chat import CHATML, encode_chat, render_chat
from reame_core.tools import FunctionTool, ToolUse, call_text, instructions, response_text

QWEN = (Path(__file__).parent / "templates" / "qwen2.5-instruct.jinja").read_text()
WEATHER = FunctionTool(
    "weather",
    "The forecast for a city, in °C.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
QUESTION = {"role": "user", "content": "Weather in Rome?"}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        },
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "snow"},
]


def test_a_template_that_renders_tools_gets_them_as_hugging_face_passes_them() -> None:
    prompt = render_chat([QUESTION], QWEN, functions=[WEATHER])
    # Keys in the order given, non-ASCII as is: the template's `tojson` is Hugging Face's.
    signature = json.dumps(WEATHER.definition(), ensure_ascii=False)
    assert f"<tools>\n{signature}\n</tools>" in prompt
    assert prompt.endswith("<|im_start|>user\nWeather in Rome?<|im_end|>\n<|im_start|>assistant\n")


def test_the_wire_format_is_what_the_template_writes_for_earlier_calls() -> None:
    prompt = render_chat([QUESTION, CALLED, *RESULTS], QWEN, functions=[WEATHER])
    rome, oslo = call_text("weather", {"city": "Rome"}), call_text("weather", {"city": "Oslo"})
    assert f"<|im_start|>assistant\n{rome}\n{oslo}<|im_end|>" in prompt
    assert (
        f"<|im_start|>user\n{response_text('sunny')}\n{response_text('snow')}<|im_end|>" in prompt
    )


def test_a_template_without_tools_gets_the_functions_in_the_system_message() -> None:
    system = {"role": "system", "content": "Be brief."}
    prompt = render_chat([system, QUESTION], CHATML, functions=[WEATHER])
    assert prompt.startswith(f"<|im_start|>system\nBe brief.\n\n{instructions([WEATHER])}")
    alone = render_chat([QUESTION], CHATML, functions=[WEATHER])
    assert alone.startswith(f"<|im_start|>system\n{instructions([WEATHER])}<|im_end|>")


def test_a_template_without_tools_reads_calls_and_results_as_text() -> None:
    calling: dict[str, Any] = {**CALLED, "content": "Looking."}
    prompt = render_chat([QUESTION, calling, *RESULTS], CHATML)
    rome, oslo = call_text("weather", {"city": "Rome"}), call_text("weather", {"city": "Oslo"})
    assert f"<|im_start|>assistant\nLooking.\n{rome}\n{oslo}<|im_end|>" in prompt
    assert (
        f"<|im_start|>user\n{response_text('sunny')}\n{response_text('snow')}<|im_end|>" in prompt
    )
    assert "<tools>" not in prompt


def test_tool_choice_none_keeps_the_functions_out_of_the_prompt() -> None:
    info = FakeBackend().info
    offered = encode_chat(info, [QUESTION], tools=ToolUse((WEATHER,)))
    withheld = encode_chat(info, [QUESTION], tools=ToolUse((WEATHER,), "none"))
    assert withheld == encode_chat(info, [QUESTION])
    assert len(offered) > len(withheld)


def test_arguments_that_are_not_json_are_rendered_as_sent() -> None:
    broken = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
        ],
    }
    assert call_text("f", "{oops") in render_chat([QUESTION, broken], CHATML)
