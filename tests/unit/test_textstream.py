"""TextStream: token bytes in, only complete and final text out."""

from __future__ import annotations

from reame_core.engine.textstream import TextStream


def push_each_byte(stream: TextStream, text: str) -> list[str]:
    return [stream.push(bytes([byte])) for byte in text.encode()]


def test_utf8_character_split_across_pushes_is_released_whole() -> None:
    stream = TextStream()

    assert stream.push(b"a\xe2") == "a"
    assert stream.push(b"\x82") == ""
    assert stream.push(b"\xac!") == "\u20ac!"
    assert stream.text == "a\u20ac!"


def test_stop_string_split_across_pushes_is_never_emitted() -> None:
    stream = TextStream(stops=["END"])

    deltas = push_each_byte(stream, "abcEND")

    assert "".join(deltas) == "abc"
    assert not any(letter in delta for delta in deltas for letter in "END")
    assert stream.stopped


def test_text_after_a_stop_string_is_dropped() -> None:
    stream = TextStream(stops=["END"])

    assert stream.push(b"abENDcd") == "ab"
    assert stream.push(b"more") == ""
    assert stream.finish() == ""
    assert stream.text == "ab"


def test_held_partial_stop_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    stream = TextStream(stops=["END"])

    assert stream.push(b"abE") == "ab"
    assert stream.push(b"N") == ""
    assert stream.push(b"x") == "ENx"
    assert not stream.stopped


def test_finish_releases_held_stop_prefix() -> None:
    stream = TextStream(stops=["END"])

    assert stream.push(b"abEN") == "ab"
    assert stream.finish() == "EN"
    assert stream.text == "abEN"


def test_finish_drops_an_incomplete_character() -> None:
    stream = TextStream()

    assert stream.push(b"a\xe2\x82") == "a"
    assert stream.finish() == ""
    assert "\ufffd" not in stream.text


def test_earliest_of_several_stop_strings_wins() -> None:
    stream = TextStream(stops=["xyz", "bc"])

    assert stream.push(b"abcxyz") == "a"
    assert stream.text == "a"


def test_stop_string_completed_by_a_multibyte_character_is_cut() -> None:
    stream = TextStream(stops=["\u00e9!"])

    deltas = push_each_byte(stream, "caf\u00e9!")

    assert "".join(deltas) == "caf"
    assert stream.stopped
