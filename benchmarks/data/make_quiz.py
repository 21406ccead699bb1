"""Writes quiz.jsonl, the short-answer quiz benchmarks/conclave.py runs on: fifty questions
with one numeric answer each, at the edge of what a small instruct model gets right.
Thirty are arithmetic: one-step word problems and bare sums, differences and products
(the one-digit ones within a 135M model's reach now and then, the two-digit products where
a 1.5B model slips). Twenty are extraction: a field read out of a short business text that
holds two other numbers too. Seeded, so rerunning writes the same file.

    .venv/bin/python benchmarks/data/make_quiz.py
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

QUIZ = Path(__file__).with_name("quiz.jsonl")
SEED = 2026
NAMES = ("Tom", "Anna", "Marco", "Lucia", "Sam", "Giulia", "Ben", "Sofia", "Omar", "Elena")
THINGS = ("apples", "pencils", "stickers", "marbles", "cookies", "stamps", "shells", "cards")
COMPANIES = ("Acme", "Brightline", "Nordwerk", "Castello SpA", "Bluefin Ltd", "Orto Verde")
MONTHS = ("January", "March", "April", "June", "September", "November")
CITIES = ("Lyon", "Turin", "Leeds", "Graz", "Porto", "Gdansk")
ITEMS = ("desk lamps", "office chairs", "printer cartridges", "water filters", "cable reels")

Question = tuple[str, int]


def arithmetic(rng: random.Random) -> list[Question]:
    """Each of ten shapes three times."""

    def buys() -> Question:
        name, things = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(6, 48), rng.randint(5, 39)
        return (
            f"{name} has {a} {things} and buys {b} more. How many {things} does {name} have now?",
            a + b,
        )

    def gives() -> Question:
        name, things, a = rng.choice(NAMES), rng.choice(THINGS), rng.randint(25, 90)
        b = rng.randint(6, a - 5)
        return (
            f"{name} had {a} {things} and gave {b} of them to a friend. "
            f"How many {things} does {name} have left?",
            a - b,
        )

    def boxes() -> Question:
        things, a, b = rng.choice(THINGS), rng.randint(3, 9), rng.randint(4, 12)
        return (
            f"There are {a} boxes with {b} {things} in each box. "
            f"How many {things} are there in all?",
            a * b,
        )

    def tickets() -> Question:
        a, b = rng.randint(12, 29), rng.randint(13, 38)
        return (
            f"A train ticket costs {a} dollars. How many dollars do {b} tickets cost?",
            a * b,
        )

    def pages() -> Question:
        name, a, b = rng.choice(NAMES), rng.randint(6, 25), rng.randint(3, 7)
        return (
            f"{name} reads {a} pages every day. How many pages does {name} read in {b} days?",
            a * b,
        )

    def bus() -> Question:
        a = rng.randint(20, 60)
        b = rng.randint(4, a - 8)
        return (
            f"A bus has {a} passengers. At the next stop {b} passengers get off and nobody "
            "gets on. How many passengers are on the bus now?",
            a - b,
        )

    def shares() -> Question:
        b, each = rng.randint(3, 8), rng.randint(3, 9)
        return (
            f"{b * each} sweets are shared equally among {b} children. "
            "How many sweets does each child get?",
            each,
        )

    def plus() -> Question:
        a, b = rng.randint(14, 89), rng.randint(12, 79)
        return f"What is {a} + {b}?", a + b

    def minus() -> Question:
        a = rng.randint(40, 99)
        b = rng.randint(11, a - 6)
        return f"What is {a} - {b}?", a - b

    def times() -> Question:
        a, b = rng.randint(12, 39), rng.randint(13, 49)
        return f"What is {a} times {b}?", a * b

    shapes = (buys, gives, boxes, tickets, pages, bus, shares, plus, minus, times)
    return [shape() for _ in range(3) for shape in shapes]


def extract(rng: random.Random) -> list[Question]:
    """A short text holding three different numbers; the question names one of them."""

    def numbers(*ranges: tuple[int, int]) -> list[int]:
        while True:
            drawn = [rng.randint(low, high) for low, high in ranges]
            if len(set(drawn)) == len(drawn):
                return drawn

    def invoice(field: str) -> Question:
        number, total, day = numbers((1000, 9999), (120, 980), (2, 28))
        company, month = rng.choice(COMPANIES), rng.choice(MONTHS)
        text = f"Invoice {number} from {company}, total {total} EUR, due {day} {month}."
        asked = {
            "total": ("What is the invoice total in EUR?", total),
            "number": ("What is the invoice number?", number),
            "day": ("On which day of the month is it due?", day),
        }
        return f"{text} {asked[field][0]}", asked[field][1]

    def order(field: str) -> Question:
        number, units, day = numbers((200, 999), (12, 95), (2, 28))
        item, city, month = rng.choice(ITEMS), rng.choice(CITIES), rng.choice(MONTHS)
        text = f"Order {number}: {units} {item} shipped to {city} on {day} {month}."
        asked = {
            "units": ("How many units were shipped?", units),
            "number": ("What is the order number?", number),
        }
        return f"{text} {asked[field][0]}", asked[field][1]

    def ticket(field: str) -> Question:
        number, floor, jams = numbers((3000, 8999), (2, 9), (11, 30))
        text = f"Ticket {number}: the printer on floor {floor} jammed {jams} times this week."
        asked = {
            "floor": ("On which floor is the printer?", floor),
            "jams": ("How many times did the printer jam?", jams),
        }
        return f"{text} {asked[field][0]}", asked[field][1]

    def meeting(field: str) -> Question:
        room, people, minutes = numbers((101, 499), (4, 14), (30, 90))
        text = f"The review with {people} people moved to room {room}; it lasts {minutes} minutes."
        asked = {
            "room": ("Which room is the review in?", room),
            "people": ("How many people are in the review?", people),
        }
        return f"{text} {asked[field][0]}", asked[field][1]

    plan: tuple[tuple[Callable[[str], Question], tuple[str, ...]], ...] = (
        (invoice, ("total", "number", "day", "total", "number", "day")),
        (order, ("units", "number", "units", "number", "units")),
        (ticket, ("floor", "jams", "floor", "jams", "floor")),
        (meeting, ("room", "people", "room", "people")),
    )
    return [maker(field) for maker, fields in plan for field in fields]


def main() -> None:
    rng = random.Random(SEED)
    rows = [{"question": q, "answer": str(a), "kind": "arithmetic"} for q, a in arithmetic(rng)]
    rows += [{"question": q, "answer": str(a), "kind": "extract"} for q, a in extract(rng)]
    rng.shuffle(rows)  # so the first N questions (a quick run's subset) hold both kinds
    QUIZ.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} questions written to {QUIZ}")


if __name__ == "__main__":
    main()
