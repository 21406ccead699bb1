"""Reading tool calls back from a reply's text: whole and streamed, which must agree however
the text is cut into pieces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reame_core.server.tool_calls import ToolCallReader, delta, message
from reame_core.tools import CALL_CLOSE, CALL_OPEN, call_text

ROME = call_text("weather", {"city": "Rome", "days": [1, 2], "note": 'say "hi" {}'})
TIME = call_text("clock", {})


def calls(text: str) -> list[tuple[str, Any]]:
    """The (name, decoded arguments) of the calls a whole reply holds."""
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in message(text).get("tool_calls", [])
    ]


def streamed(text: str, size: int) -> dict[str, Any]:
    """`text` streamed in pieces of `size` characters, the deltas accumulated as an OpenAI
    client does: content joined, each call's fragments joined by index."""
    reader = ToolCallReader()
    content = ""
    joined: dict[int, dict[str, Any]] = {}
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    for part in [*(delta(reader.feed(piece)) for piece in pieces), delta(reader.close())]:
        content += part.get("content", "")
        for fragment in part.get("tool_calls", []):
            call = joined.setdefault(fragment["index"], {"arguments": ""})
            if "id" in fragment:
                assert fragment["type"] == "function" and "name" not in call
                call.update(id=fragment["id"], name=fragment["function"]["name"])
            call["arguments"] += fragment["function"]["arguments"]
    return {"content": content, "calls": [joined[i] for i in sorted(joined)]}


def test_text_without_calls_is_the_content() -> None:
    assert message("It is sunny.\n") == {"role": "assistant", "content": "It is sunny.\n"}
    assert message("") == {"role": "assistant", "content": ""}


def test_a_call_becomes_a_tool_call_and_the_content_null() -> None:
    reply = message(ROME)
    assert reply["content"] is None
    [call] = reply["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {
        "city": "Rome",
        "days": [1, 2],
        "note": 'say "hi" {}',
    }


def test_several_calls_keep_their_order_and_distinct_ids() -> None:
    reply = message(f"{ROME}\n{TIME}\n")
    assert [c["function"]["name"] for c in reply["tool_calls"]] == ["weather", "clock"]
    assert len({c["id"] for c in reply["tool_calls"]}) == 2


def test_text_before_the_calls_is_the_content_without_its_trailing_blank() -> None:
    reply = message(f"Let me look.\n{ROME}")
    assert reply["content"] == "Let me look."
    assert calls(f"Let me look.\n{ROME}") == calls(ROME)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(
    "text",
    [
        "Plain text with a < sign and <tool_ca but no call.\n",
        ROME,
        f"First <b>this</b>.\n{ROME}\n{TIME}",
        f"{CALL_OPEN}\nnot json\n{CALL_CLOSE}",
    ],
    ids=["text", "one call", "text and two calls", "a block that is no call"],
)
def test_streamed_pieces_add_up_to_the_whole_reply(text: str, size: int) -> None:
    whole = message(text)
    stream = streamed(text, size)
    assert stream["content"] == (whole["content"] or "")
    assert [(c["name"], c["arguments"]) for c in stream["calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])
    ]


def test_arguments_stream_as_the_model_writes_them() -> None:
    reader = ToolCallReader()
    head = delta(reader.feed(f'{CALL_OPEN}\n{{"name": "weather", "arguments": {{"ci'))
    assert head["tool_calls"] == [
        {
            "index": 0,
            "id": head["tool_calls"][0]["id"],
            "type": "function",
            "function": {"name": "weather", "arguments": '{"ci'},
        }
    ]
    more = delta(reader.feed('ty": "Rome"}}\n'))
    assert more == {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Rome"}'}}]}
    assert delta(reader.feed(CALL_CLOSE)) == {} and reader.called


def test_text_that_may_open_a_call_is_held_back_until_it_does_not() -> None:
    reader = ToolCallReader()
    assert delta(reader.feed("Use <tool")) == {"content": "Use"}
    assert delta(reader.feed("box> now")) == {"content": " <toolbox> now"}


def test_a_call_written_in_another_layout_is_read_once_complete() -> None:
    text = f'{CALL_OPEN}\n{{"arguments": {{"city": "Rome"}}, "name": "weather"}}\n{CALL_CLOSE}'
    assert calls(text) == [("weather", {"city": "Rome"})]
    assert calls(text.replace('{"arguments"', '{ "name" : "clock", "arguments"', 1)) == [
        ("clock", {"city": "Rome"})
    ]


def test_a_block_that_names_no_function_stays_content() -> None:
    text = f'{CALL_OPEN}\n{{"city": "Rome"}}\n{CALL_CLOSE}'
    assert message(text) == {"role": "assistant", "content": text}


def test_a_call_cut_off_keeps_the_arguments_written_so_far() -> None:
    reply = message(ROME[: ROME.index("Rome") + 2])
    assert reply["tool_calls"][0]["function"]["arguments"] == '{"city": "Ro'


def test_a_call_cut_off_before_its_name_stays_content() -> None:
    cut = f'{CALL_OPEN}\n{{"name": "wea'
    assert message(cut) == {"role": "assistant", "content": cut}
