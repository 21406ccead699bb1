"""A real `reame serve` on SmolLM2-135M whose disk fails under it: its prefix cache and
archive damaged between two runs, then its disk full while it serves. Every answer is the
one the server gave before any fault, the damage is never used, and each fault is said
once in the log and counted in `reame_disk_faults_total`."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import soak
from common import free_port

if TYPE_CHECKING:
    from conftest import SmallDisk

# Long enough (over 128 tokens) for the cache to keep a snapshot of each.
SYSTEM = (
    "You are the dispatcher of Ferrovie Alpine, a small mountain railway with four lines. "
    "Line A runs from Tirano to Bormio every hour from six in the morning to nine at night. "
    "Line B runs from Bormio to Livigno every two hours and stops at Valdidentro. Line C is "
    "a summer line from Livigno to the Forcola pass, running only from June to September. "
    "Bicycles travel free on lines A and B, and cost three euros on line C. Children under "
    "six travel free, and children under fourteen pay half. Groups of more than ten people "
    "must book two days ahead by writing to the dispatcher. When snow closes a line, buses "
    "replace the trains and tickets stay valid. Answer travellers briefly."
)
OTHER_SYSTEM = (
    "You keep the harbour log of Trieste. Ships due on Tuesday are the Maria Stella, the "
    "Nettuno and the Aurora; on Wednesday only the ferry to Muggia and the pilot boat. "
    "Ships due on Thursday are the Santa Lucia and the Cormorano, both from Venice, and "
    "on Friday the tanker Adriatica, which berths at the oil terminal and not in the old "
    "port. Pilots board every ship at the outer buoy, and no ship may enter after sunset "
    "without the harbour master's leave, which he gives only in writing and only to ships "
    "of less than ten thousand tons. Answer in one short sentence, naming the ships exactly."
)
ASKED = [
    (SYSTEM, "Can I take my bicycle to Livigno?"),
    (SYSTEM, "How much does my child of ten pay?"),
    (OTHER_SYSTEM, "Which ships are due on Tuesday?"),
]


def ask(url: str, system: str, question: str, **extra: Any) -> str:
    body = {
        **extra,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def disk_faults(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = r'^reame_disk_faults_total\{kind="(\w+)",store="(\w+)"\} (\S+)$'
    return {(store, kind): float(v) for kind, store, v in re.findall(pattern, text, re.M)}


def warnings_in(log: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("level") == "warning"]


def flip_a_byte_in_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def test_damaged_and_full_disk_leave_answers_unchanged_and_are_said_once(
    small_disk: Callable[..., SmallDisk], tmp_path: Path
) -> None:
    disk = small_disk(64 << 20)
    # Recall off: the second server computes (and archives) what the first answered. The
    # host plan grants a 64 MiB disk no budget at all: budgets are set, so the disk fills.
    flags = ["--kv-cache-dir", str(disk.path / "kv"), "--palimpsest-dir",
             str(disk.path / "archive"), "--speculate", "off", "--palimpsest-no-recall",
             "--kv-cache-budget", "1GiB", "--palimpsest-budget", "1GiB"]  # fmt: skip
    port = free_port()
    with soak.reame_serve(port, flags, tmp_path / "cold.log"):
        cold = [ask(f"http://127.0.0.1:{port}", *pair) for pair in ASKED]
    entries = sorted((disk.path / "kv").glob("v1/*.kv"))
    segments = sorted((disk.path / "archive").glob("v1/*/*.seg"))
    assert len(entries) == 2 and segments
    for path in [*entries, *segments]:
        flip_a_byte_in_the_middle(path)

    log = tmp_path / "faults.log"
    with soak.reame_serve(port, flags, log):
        url = f"http://127.0.0.1:{port}"
        # The damaged entry is refused and computed again; not archived, so that the archive's
        # first append, into a new segment, comes once the disk is full.
        restored = ask(url, *ASKED[0], palimpsest=False)
        disk.fill()
        full = [ask(url, *pair) for pair in ASKED[1:]]
        faults = disk_faults(url)

    assert [restored, *full] == cold
    assert faults[("diskkv", "corrupt_entry")] >= 1
    assert faults[("palimpsest", "damaged_record")] >= 1
    assert faults[("palimpsest", "write_error")] >= 1
    said = [w["event"] for w in warnings_in(log)]
    assert sum("corrupt entry" in s for s in said) == faults[("diskkv", "corrupt_entry")]
    assert sum("archive cannot write" in s for s in said) == 1
    assert sum("damaged or torn" in s for s in said) == len(segments)
