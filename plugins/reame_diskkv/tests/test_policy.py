"""Where prompts are snapshot, and when a stored prefix is worth reading back."""

from __future__ import annotations

from reame_diskkv.policy import SnapshotPolicy

END = 9  # the end-of-turn token in these prompts
EOT = frozenset({END})


def chat(*turn_lengths: int, tail: int = 5) -> list[int]:
    """A prompt of turns (each closed by END) and an open assistant turn of `tail` tokens."""
    tokens: list[int] = []
    for length in turn_lengths:
        tokens += [1] * (length - 1) + [END]
    return tokens + [2] * tail


def test_chat_prompt_is_snapshot_at_the_end_of_its_system_prompt() -> None:
    assert SnapshotPolicy(turns=1, min_tokens=64).points(chat(300, 40), EOT) == [300]


def test_more_turns_give_more_points() -> None:
    assert SnapshotPolicy(turns=2, min_tokens=64).points(chat(300, 40), EOT) == [300, 340]


def test_conversations_add_the_end_of_a_sessions_last_turn() -> None:
    policy = SnapshotPolicy(turns=1, min_tokens=64, conversations=True)

    assert policy.points(chat(300, 40, 60, 20), EOT, session=True) == [300, 420]
    assert policy.points(chat(300, 40, 60, 20), EOT) == [300]  # not expected back
    assert policy.points(chat(300), EOT, session=True) == [300]  # the last turn is the first
    assert policy.points(chat(300, 40, tail=1), EOT, session=True) == [300]  # not the tail
    off = SnapshotPolicy(turns=1, min_tokens=64)
    assert off.points(chat(300, 40, 60, 20), EOT, session=True) == [300]


OPENING = (3, 4, 5)  # the tokens a user's turn opens with, in these prompts


def opened(*turn_lengths: int, tail: int = 5) -> list[int]:
    """`chat`, each turn after the first opening as a user's does."""
    tokens: list[int] = []
    for i, length in enumerate(turn_lengths):
        opening = list(OPENING) if i else []
        tokens += opening + [1] * (length - len(opening) - 1) + [END]
    return tokens + [2] * tail


def test_a_turn_end_followed_by_a_users_opening_is_snapshot_past_it() -> None:
    policy = SnapshotPolicy(turns=1, min_tokens=64, conversations=True)

    assert policy.points(opened(300, 40), EOT, opening=OPENING) == [303]
    assert policy.points(opened(300, 40), EOT) == [300]  # no opening known
    assert policy.points(chat(300, 40), EOT, opening=OPENING) == [300]  # another follows
    # A session's conversation so far ends with its last turn, where the assistant's
    # turn opens, not a user's: there the point stays.
    assert policy.points(opened(300, 40, 60), EOT, session=True, opening=OPENING) == [303, 400]
    # Never into the two tokens the engine always computes.
    assert policy.points([*chat(300, tail=0), *OPENING, 1], EOT, opening=OPENING) == [300]
    assert policy.points([*chat(300, tail=0), *OPENING, 1, 1], EOT, opening=OPENING) == [303]


def test_turn_shorter_than_the_minimum_is_not_stored() -> None:
    assert SnapshotPolicy(turns=2, min_tokens=128).points(chat(100, 60), EOT) == [160]


def test_prompt_without_turns_is_snapshot_at_its_last_block_boundary() -> None:
    policy = SnapshotPolicy(block_tokens=256, min_tokens=64)

    assert policy.points([1] * 700, EOT) == [512]


def test_block_boundary_never_covers_the_last_two_tokens() -> None:
    policy = SnapshotPolicy(block_tokens=256, min_tokens=64)

    assert policy.points([1] * 513, EOT) == [256]
    assert policy.points([1] * 514, EOT) == [512]


def test_turn_ending_in_the_last_two_tokens_is_not_a_point() -> None:
    assert SnapshotPolicy(turns=1, min_tokens=64).points(chat(300, tail=1), EOT) == []


def test_no_points_when_turns_and_blocks_are_off() -> None:
    assert SnapshotPolicy(turns=0, block_tokens=0).points(chat(300, 40), EOT) == []


def test_restore_must_save_enough_beyond_what_the_slots_hold() -> None:
    policy = SnapshotPolicy(min_tokens=128)

    assert policy.worth_restoring(shared=2000, stored=2000, reused=0)
    assert not policy.worth_restoring(shared=2000, stored=2000, reused=1990)
    assert not policy.worth_restoring(shared=100, stored=3000, reused=0)
    assert not policy.worth_restoring(shared=140, stored=8000, reused=0)
