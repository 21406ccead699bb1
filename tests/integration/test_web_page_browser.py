"""The web page in a real browser: headless Chromium (the system's, driven by Playwright)
against `reame serve` on SmolLM2-135M.

One server for the module, with an API key, so every page first asks for it. Skipped only
when no Chromium is found; REAME_CHROMIUM names one elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from served import reame_serve

pytestmark = pytest.mark.browser

API_KEY = "web-test-key"
MARKUP = '<script>alert(1)</script><img src=x onerror="window.pwned = 1">'


def chromium() -> str | None:
    named = os.environ.get("REAME_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with reame_serve(
        "--parallel", "2", "--ctx", "1024", "--threads", "2", "--api-key", API_KEY
    ) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (install Debian's chromium, or set REAME_CHROMIUM)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, server_url: str) -> Iterator[Page]:
    """The page, in a browser context of its own, once it has the key and the model."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.goto(server_url)
    give_key(opened, API_KEY)
    expect(opened.locator("#model")).to_have_text("smollm2-135m")
    yield opened
    context.close()
    # The first call to /status is refused until the key is given: the browser logs that 401.
    assert [e for e in errors if "401" not in e] == []


def give_key(page: Page, key: str) -> None:
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key", key)
    page.press("#key", "Enter")


def open_options(page: Page) -> None:
    page.locator("details.options").evaluate("details => { details.open = true; }")


def ask(page: Page, text: str, max_tokens: int = 24) -> None:
    """Send `text` greedily and wait until its answer has ended."""
    open_options(page)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(max_tokens))
    answers = page.locator(".message.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    answer = page.locator(".message.assistant").nth(answers)
    expect(answer.locator(".savings, .failure")).to_have_count(1, timeout=30_000)


def tokens(savings: Locator, part: str) -> int:
    """A count the savings line under an answer holds (its data-* attributes)."""
    return int(savings.get_attribute(f"data-{part}") or "0")


def test_an_answer_streams_in_pieces(page: Page) -> None:
    # Count the times the answer's text changes before it ends.
    page.evaluate(
        """() => {
            window.textChanges = 0;
            const answerText = (node) =>
                node.classList?.contains("text") && node.parentElement.matches(".assistant");
            new MutationObserver((records) => {
                window.textChanges += records.filter((r) => answerText(r.target)).length;
            }).observe(document.getElementById("messages"), {subtree: true, childList: true});
        }"""
    )
    ask(page, "Write a short poem about the sea.", max_tokens=48)

    text = page.locator(".message.assistant .text").first.text_content() or ""
    assert len(text.split()) > 5
    assert page.evaluate("window.textChanges") > 5
    expect(page.locator(".savings").first).to_contain_text("tok/s")


def test_second_turn_reuses_the_first_from_the_session(page: Page) -> None:
    ask(page, "What is the capital of France?")
    ask(page, "And of Italy?")

    first, second = page.locator(".savings").all()
    first_prompt = sum(tokens(first, part) for part in ("reused", "restored", "computed"))
    # The whole first prompt at least: the session kept its KV in a slot.
    assert tokens(second, "cached") >= first_prompt > 0
    expect(second.locator(".figures")).to_contain_text("reused in a slot")


def test_status_view_shows_the_governor_and_the_configuration(page: Page) -> None:
    ask(page, "Say hello.")
    page.click("#show-status")

    expect(page.locator('#governor tr[data-source="prompt_lookup"]')).to_be_visible()
    expect(page.locator("#configuration")).to_contain_text("threads")
    expect(page.locator("#totals")).to_contain_text("requests answered")
    expect(page.locator("#now")).to_contain_text("slots busy")


def test_a_wrong_key_is_refused_with_a_clear_message(browser: Browser, server_url: str) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(server_url)
    expect(page.locator("#key-message")).to_have_text("This server asks for an API key.")

    give_key(page, "not-the-key")
    expect(page.locator("#key-message")).to_contain_text("refused this API key")
    give_key(page, API_KEY)

    expect(page.locator("#model")).to_have_text("smollm2-135m")
    assert page.evaluate("sessionStorage.getItem('reame-api-key')") == API_KEY
    context.close()


def test_markup_in_a_prompt_is_shown_as_text(page: Page) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    scripts = page.locator("script").count()

    ask(page, f"Repeat exactly: {MARKUP}")

    expect(page.locator(".message.user .text")).to_have_text(f"Repeat exactly: {MARKUP}")
    assert page.locator("#messages img, #messages script").count() == 0
    assert page.locator("script").count() == scripts
    assert page.evaluate("window.pwned") is None
    assert dialogs == []


def test_stop_ends_the_answer_and_frees_the_slot(page: Page, server_url: str) -> None:
    open_options(page)
    page.fill("#max-tokens", "900")
    page.fill("#prompt", "Tell me a very long story about a lighthouse keeper.")
    page.press("#prompt", "Enter")
    expect(page.locator(".message.assistant .text")).not_to_have_text("", timeout=30_000)
    page.click("#stop")

    expect(page.locator(".message.assistant .failure")).to_contain_text("Stopped")
    # Long before 900 tokens could have been generated, the server has ended the call.
    deadline = time.monotonic() + 3
    while in_flight(server_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_flight(server_url) == 0


def in_flight(server_url: str) -> int:
    status = httpx.get(f"{server_url}/status", headers={"Authorization": f"Bearer {API_KEY}"})
    return int(status.json()["load"]["in_flight"])


def test_json_schema_box_gives_a_structured_answer(page: Page) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    open_options(page)
    page.fill("#schema", json.dumps(schema))

    ask(page, "Name a city in France.", max_tokens=40)

    answer = json.loads(page.locator(".message.assistant .text").text_content() or "")
    assert isinstance(answer["city"], str)


def test_best_of_slider_shows_the_tally(page: Page) -> None:
    open_options(page)
    page.locator("#best-of").fill("3")

    ask(page, "What is 2 + 2? Answer with a number.", max_tokens=16)

    expect(page.locator(".tally")).to_contain_text("Best of 3")
