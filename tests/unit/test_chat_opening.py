"""The tokens a user's turn opens with in a model's chat template (`chat.user_turn_opening`),
which the disk prefix cache takes into a system prompt's snapshot."""

from __future__ import annotations

import dataclasses

from reame_core.backend.fake import IM_START, FakeBackend
from reame_core.chat import encode_chat, user_turn_opening

# A template with no system turn of its own: the system message opens the first user turn.
FOLDED_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns = m['content'] %}"
    "{% else %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
)


def test_chatml_opens_a_users_turn_with_its_header() -> None:
    model = FakeBackend().info

    opening = user_turn_opening(model)

    assert opening == (ord("\n"), IM_START, *b"user\n")
    prompt = encode_chat(
        model, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    turn_end = prompt.index(next(t for t in prompt if t in model.eog)) + 1
    assert tuple(prompt[turn_end : turn_end + len(opening)]) == opening


def test_a_template_without_a_system_turn_has_no_opening() -> None:
    model = dataclasses.replace(FakeBackend().info, chat_template=FOLDED_SYSTEM)

    assert user_turn_opening(model) == ()
