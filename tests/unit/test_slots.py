"""KVSlots: which slot a prompt reuses, and that a slot's tokens always equal its KV."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from reame_core.backend.base import Batch
from reame_core.backend.fake import FakeBackend
from reame_core.engine.slots import KVRollbackError, KVSlots, Slot


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend(n_seq_max=3)


@pytest.fixture
def slots(backend: FakeBackend) -> KVSlots:
    return KVSlots(backend)


def fill(backend: FakeBackend, slots: KVSlots, slot: Slot, tokens: Sequence[int]) -> None:
    """Decode `tokens` after what the slot holds, as the engine computes a prompt chunk."""
    batch = Batch()
    for offset, token in enumerate(tokens):
        batch.add(token, len(slot.tokens) + offset, slot.seq_id, False)
    backend.decode(batch)
    slots.appended(slot, tokens, chunk=True)


def assert_in_step(backend: FakeBackend, slots: KVSlots) -> None:
    for slot in slots.slots:
        assert slot.tokens == backend.kv[slot.seq_id], f"slot {slot.seq_id}"


# ------------------------------------------------------------------ prefix matching


def test_longest_prefix_picks_the_slot_sharing_most_leading_tokens(
    backend: FakeBackend, slots: KVSlots
) -> None:
    first, second, _ = slots.slots
    fill(backend, slots, first, [1, 2, 9, 9])
    fill(backend, slots, second, [1, 2, 3, 9])

    match = slots.longest_prefix([1, 2, 3, 4, 5], limit=4)

    assert match is not None
    assert (match.slot, match.length) == (second, 3)


def test_longest_prefix_is_capped_at_the_limit(backend: FakeBackend, slots: KVSlots) -> None:
    fill(backend, slots, slots.slots[0], [1, 2, 3, 4])

    match = slots.longest_prefix([1, 2, 3, 4], limit=3)

    assert match is not None and match.length == 3


def test_longest_prefix_is_none_when_no_slot_shares_a_token(
    backend: FakeBackend, slots: KVSlots
) -> None:
    fill(backend, slots, slots.slots[0], [7, 8])

    assert slots.longest_prefix([1, 2, 3], limit=2) is None


# ------------------------------------------------------------------------ acquiring


def test_acquire_takes_the_preferred_slot_when_it_is_free(slots: KVSlots) -> None:
    preferred = slots.slots[2]

    assert slots.acquire(prefer=preferred) is preferred
    assert preferred.busy


def test_acquire_takes_the_least_recently_used_slot_when_preferred_is_busy(
    slots: KVSlots,
) -> None:
    first, second, third = (slots.acquire() for _ in range(3))
    slots.release(second)
    slots.release(first)
    slots.release(third)
    slots.acquire(prefer=third)

    assert slots.acquire(prefer=third) is second
    assert slots.acquire() is first


def test_acquire_keeps_busy_sequence_ids_consecutive() -> None:
    # With per-sequence KV, only consecutive ids decode in one pass over the weights.
    slots = KVSlots(FakeBackend(n_seq_max=6))
    taken = [slots.acquire() for _ in range(4)]  # ids 0-3
    for slot in (taken[1], taken[3]):
        slots.release(slot)  # busy: 0 and 2; slot 3 was released last

    assert slots.acquire().seq_id == 1  # 0-2 in one run, where 4 or 5 would make two


def held(slots: KVSlots) -> set[str]:
    """The sessions whose conversation the engine holds, in a slot or kept aside."""
    in_slots, kept_aside = slots.holdings()
    return in_slots | kept_aside


def test_a_slot_holds_its_sessions_conversation_until_another_request_takes_it() -> None:
    slots = KVSlots(FakeBackend(n_seq_max=4))  # two pins
    for session in ("a", "b", "c"):
        slots.release(slots.acquire(session=session), session)
    # "a" is unpinned by "c", but nothing has taken its slot yet.
    assert held(slots) == {"a", "b", "c"}
    assert sum(s.session is not None for s in slots.slots) == 2
    slots.acquire()  # the free unpinned slot: nobody's conversation
    assert held(slots) == {"a", "b", "c"}
    slots.acquire()  # the least recently used of the rest: "a"'s
    assert held(slots) == {"b", "c"}


def _decoded(backend: FakeBackend, slots: KVSlots, slot: Slot, tokens: Sequence[int]) -> None:
    """Decode `tokens` after what the slot holds one at a time, as answer tokens."""
    for token in tokens:
        batch = Batch()
        batch.add(token, len(slot.tokens), slot.seq_id, True)
        backend.decode(batch)
        slots.appended(slot, [token])


def test_a_pinned_slot_taken_over_keeps_the_exact_part_of_its_conversation_for_the_next_turn() -> (
    None
):
    backend = FakeBackend(n_seq_max=1)
    slots = KVSlots(backend, max_sessions=1)
    slot = slots.acquire(session="chat")
    fill(backend, slots, slot, [1, 2, 3, 4])  # the turn's prompt
    _decoded(backend, slots, slot, [5, 6])  # its answer, not exactly reusable
    slots.release(slot, "chat")

    taken = slots.acquire()  # the only free slot: pinned, so its conversation is kept aside
    assert taken is slot and held(slots) == {"chat"}
    slots.truncate(taken, 0)
    fill(backend, slots, taken, [7, 8, 9])
    slots.release(taken)

    again = slots.acquire(session="chat")
    assert slots.restore_spilled(again, "chat", [1, 2, 3, 4, 5, 6, 10, 11], limit=6)
    assert again.tokens == backend.kv[again.seq_id] == [1, 2, 3, 4]
    assert again.exact == 4
    assert not slots.restore_spilled(again, "chat", [1, 2, 3, 4, 5], limit=3)  # used once


def test_a_kept_conversation_is_restored_only_where_the_next_prompt_continues_it() -> None:
    backend = FakeBackend(n_seq_max=1)
    slots = KVSlots(backend, max_sessions=1)
    slot = slots.acquire(session="chat")
    fill(backend, slots, slot, [1, 2, 3, 4])
    slots.release(slot, "chat")
    slots.release(slots.acquire())

    again = slots.acquire(session="chat")
    slots.truncate(again, 0)
    assert slots.restore_spilled(again, "chat", [1, 2, 9, 9, 9], limit=3)
    assert again.tokens == backend.kv[again.seq_id] == [1, 2]
    assert not slots.restore_spilled(again, "other", [1, 2, 3, 4, 5], limit=3)


def test_a_conversation_is_kept_only_as_far_as_its_chunks_reach_the_grid() -> None:
    backend = FakeBackend(n_seq_max=1, chunk_grid=4)
    slots = KVSlots(backend, max_sessions=1)
    slot = slots.acquire(session="chat")
    fill(backend, slots, slot, [1, 2, 3, 4, 5, 6])  # exact to 6, reusable to 4
    slots.release(slot, "chat")
    taken = slots.acquire()
    slots.truncate(taken, 0)
    slots.release(taken)

    again = slots.acquire(session="chat")
    assert slots.restore_spilled(again, "chat", [1, 2, 3, 4, 5, 6, 7, 8, 9], limit=7)
    assert again.tokens == backend.kv[again.seq_id] == [1, 2, 3, 4]


def test_a_state_that_cannot_be_cut_back_is_not_kept() -> None:
    backend = FakeBackend(n_seq_max=1, prefix_trim_safe=False)
    slots = KVSlots(backend, max_sessions=1)
    slot = slots.acquire(session="chat")
    fill(backend, slots, slot, [1, 2, 3, 4])
    _decoded(backend, slots, slot, [5])  # the answer would have to be cut off
    slots.release(slot, "chat")
    slots.acquire()

    assert held(slots) == set()
    assert not slots.restore_spilled(slots.slots[0], "chat", [1, 2, 3, 4, 5, 6], limit=4)


def test_conversations_kept_aside_stay_within_their_memory_and_drop_the_oldest() -> None:
    backend = FakeBackend(n_seq_max=1)
    one_state = len(backend.get_seq_state(0)) + 4 * 4  # a state of four tokens
    slots = KVSlots(backend, max_sessions=1, spill_bytes=one_state)
    for session, prompt in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
        slot = slots.acquire(session=session)
        slots.truncate(slot, 0)
        fill(backend, slots, slot, prompt)
        slots.release(slot, session)
    slots.release(slots.acquire())  # takes "b"'s slot: "b" kept, "a" (kept before) dropped

    assert slots.holdings() == (set(), {"b"})
    slot = slots.acquire(session="a")
    slots.truncate(slot, 0)
    assert not slots.restore_spilled(slot, "a", [1, 2, 3, 4, 5], limit=4)
    assert slots.restore_spilled(slot, "b", [5, 6, 7, 8, 9], limit=4)
    assert slots.holdings() == ({"a"}, set())


def test_released_slot_keeps_its_kv_resident(backend: FakeBackend, slots: KVSlots) -> None:
    slot = slots.acquire()
    fill(backend, slots, slot, [1, 2, 3])

    slots.release(slot)

    assert not slot.busy
    assert slot.tokens == backend.kv[slot.seq_id] == [1, 2, 3]
    assert slots.free_count() == 3


# --------------------------------------------------------------------- KV operations


def test_truncate_keeps_the_first_tokens_in_step_with_the_kv(
    backend: FakeBackend, slots: KVSlots
) -> None:
    slot = slots.slots[0]
    fill(backend, slots, slot, [1, 2, 3, 4])

    slots.truncate(slot, 2)

    assert slot.tokens == [1, 2]
    assert_in_step(backend, slots)


def test_truncate_to_zero_empties_the_slot(backend: FakeBackend, slots: KVSlots) -> None:
    slot = slots.slots[0]
    fill(backend, slots, slot, [1, 2, 3, 4])

    slots.truncate(slot, 0)

    assert slot.tokens == []
    assert_in_step(backend, slots)


def test_copy_gives_the_destination_the_source_prefix(backend: FakeBackend, slots: KVSlots) -> None:
    source, destination, _ = slots.slots
    fill(backend, slots, source, [1, 2, 3, 4])
    fill(backend, slots, destination, [9, 9])

    slots.copy(source, destination, 3)

    assert destination.tokens == [1, 2, 3]
    assert source.tokens == [1, 2, 3, 4]
    assert_in_step(backend, slots)


def test_restore_loads_a_snapshot_into_another_slot(backend: FakeBackend, slots: KVSlots) -> None:
    source, destination, _ = slots.slots
    fill(backend, slots, source, [1, 2, 3])
    fill(backend, slots, destination, [9])

    assert slots.restore(destination, slots.snapshot(source), [1, 2, 3])

    assert destination.tokens == [1, 2, 3]
    assert_in_step(backend, slots)


def test_refused_restore_leaves_the_slot_empty_in_step_with_the_kv(
    backend: FakeBackend, slots: KVSlots
) -> None:
    slot = slots.slots[0]
    fill(backend, slots, slot, [1, 2, 3])

    assert not slots.restore(slot, b"not a state", [4, 5, 6])

    assert slot.tokens == []
    assert_in_step(backend, slots)


def test_rollback_drops_the_tokens_decoded_past_the_kept_length(
    backend: FakeBackend, slots: KVSlots
) -> None:
    slot = slots.slots[0]
    fill(backend, slots, slot, [1, 2, 3])
    fill(backend, slots, slot, [4, 5, 6])

    slots.rollback(slot, 4)

    assert slot.tokens == [1, 2, 3, 4]
    assert_in_step(backend, slots)


# ------------------------------------------------------------- untrimmable models


@pytest.fixture
def untrimmable() -> FakeBackend:
    return FakeBackend(n_seq_max=2, prefix_trim_safe=False)


def test_truncate_on_an_untrimmable_model_clears_the_slot(untrimmable: FakeBackend) -> None:
    slots = KVSlots(untrimmable)
    slot = slots.slots[0]
    fill(untrimmable, slots, slot, [1, 2, 3, 4])

    slots.truncate(slot, 2)

    assert slot.tokens == []
    assert_in_step(untrimmable, slots)


def test_longest_prefix_on_an_untrimmable_model_needs_the_whole_slot_to_prefix_the_prompt(
    untrimmable: FakeBackend,
) -> None:
    slots = KVSlots(untrimmable)
    partly_shared, whole_prefix = slots.slots
    fill(untrimmable, slots, partly_shared, [1, 2, 3, 9])
    fill(untrimmable, slots, whole_prefix, [1, 2])

    match = slots.longest_prefix([1, 2, 3, 4, 5], limit=4)

    assert match is not None
    assert (match.slot, match.length) == (whole_prefix, 2)


def test_longest_prefix_on_an_untrimmable_model_skips_a_slot_cut_by_the_limit(
    untrimmable: FakeBackend,
) -> None:
    slots = KVSlots(untrimmable)
    fill(untrimmable, slots, slots.slots[0], [1, 2, 3])

    assert slots.longest_prefix([1, 2, 3], limit=2) is None


def test_rollback_the_model_refuses_clears_the_slot_and_says_so() -> None:
    recurrent = FakeBackend(n_seq_max=2, recurrent=True)
    slots = KVSlots(recurrent)
    slot = slots.slots[0]
    fill(recurrent, slots, slot, [1, 2, 3])
    fill(recurrent, slots, slot, [4, 5, 6])

    with pytest.raises(KVRollbackError, match="--speculate off"):
        slots.rollback(slot, 4)

    assert slot.tokens == []
    assert_in_step(recurrent, slots)


# ------------------------------------------------------------------------- gap fillers


def test_gap_fillers_join_the_slots_around_one_not_decoding(
    backend: FakeBackend, slots: KVSlots
) -> None:
    fill(backend, slots, slots.slots[1], [5, 6, 7])  # slot 1 computes a prompt meanwhile

    assert slots.gap_fillers([(0, 1), (2, 1)]) == {1: 3}  # a row after its three tokens
    assert slots.gap_fillers([(0, 1), (1, 1)]) == {}  # consecutive: one pass already
    assert slots.gap_fillers([(0, 1)]) == {}


def test_gap_fillers_leave_a_layout_they_would_not_join_into_fewer_passes(
    slots: KVSlots,
) -> None:
    # Slot 2's draft needs a pass of its own either way: two passes, filled or not.
    assert slots.gap_fillers([(0, 1), (2, 5)]) == {}


def test_no_gap_filler_goes_into_a_slot_whose_kv_is_full() -> None:
    backend = FakeBackend(n_seq_max=3, n_ctx_seq=4)
    slots = KVSlots(backend)
    fill(backend, slots, slots.slots[1], [1, 2, 3, 4])

    assert slots.gap_fillers([(0, 1), (2, 1)]) == {}


def test_no_gap_fillers_on_a_model_that_cannot_drop_a_tail() -> None:
    slots = KVSlots(FakeBackend(n_seq_max=3, recurrent=True))

    assert slots.gap_fillers([(0, 1), (2, 1)]) == {}


def test_a_decode_with_its_fillers_dropped_leaves_every_slot_in_step_with_its_kv(
    backend: FakeBackend, slots: KVSlots
) -> None:
    for slot, tokens in zip(slots.slots, ([1, 2], [5, 6, 7], [8]), strict=True):
        fill(backend, slots, slot, tokens)
    fillers = slots.gap_fillers([(0, 1), (2, 1)])
    batch = Batch()
    batch.add(3, 2, 0, True)
    batch.add(0, fillers[1], 1, False)
    batch.add(9, 1, 2, True)

    backend.decode(batch)
    slots.appended(slots.slots[0], [3])
    slots.appended(slots.slots[2], [9])
    slots.drop_fillers(fillers)

    assert backend.pass_counts[-1] == 1
    assert_in_step(backend, slots)
