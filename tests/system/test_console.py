"""The web console, driven in headless Chromium against a real server (tiny GGUF + SmolLM2).

One server and one browser for the module; the tests run in order and each leaves a screenshot
of its view in test-artifacts/console/. They need Debian's `chromium` and playwright's Python
package (launched on that executable; playwright's own browser download is never used) and skip
with the reason when either is missing. What the page shows is checked against the server's own
API (/admin/models, /metrics read by prometheus_client's parser), not against the page's code.
"""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_config
from gateway.fleet.watch import WatchOptions
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO
from tests.support.servers import ThreadedServer

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()),
                None)
ARTIFACTS = REPO / "test-artifacts" / "console"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None:
    pytest.skip("browser tests need playwright (pip install playwright; no browser download)",
                allow_module_level=True)
if CHROMIUM is None:
    pytest.skip("browser tests need Chromium: apt-get install chromium", allow_module_level=True)

# The config, line by line: the test breaks line BROKEN_LINE and expects the page to name it.
CONFIG = """\
registry:
  load_timeout: 120s
models:
  - model: {tiny}
    aliases: [tiny, tiny-too]
    n_ctx: 256
  - model: {smol}
    aliases: [smollm2]
    n_ctx: 1024
"""
BROKEN_LINE = 6
BROKEN = "    n_ctx: lots\n"


class Console:
    def __init__(self, server: ThreadedServer, page: Page, config: Path) -> None:
        self.server, self.page, self.config = server, page, config
        self.url = server.url

    def api(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=10).json()

    def row(self, alias: str) -> dict[str, Any]:
        return next(r for r in self.api("/admin/models")["data"] if r["aliases"][0] == alias)

    def shot(self, name: str, full_page: bool = True) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Chromium with a fresh profile; pages that throw fail the test that made them."""
    pw = sync_playwright().start()
    try:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            args=ARGS, headless=True, viewport={"width": 1280, "height": 800})
        context.set_default_timeout(20_000)
        yield context
        context.close()
    finally:
        pw.stop()


def new_page(browser: Any) -> tuple[Page, list[str]]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


@pytest.fixture(scope="module")
def console(browser: Any, smollm2_path: Path) -> Iterator[Console]:
    with tempfile.TemporaryDirectory(prefix="modelyard-console-") as tmp:
        d = Path(tmp)
        tiny = write_tiny_llama(d / "tiny.gguf", seed=4)
        config = d / "modelyard.yaml"
        config.write_text(CONFIG.format(tiny=tiny, smol=smollm2_path))
        app = create_app(load_config(config), watch=WatchOptions(
            enabled=True, force_polling=True, poll_delay_ms=200))
        server = ThreadedServer(app)
        server.start_serving()
        try:
            page, errors = new_page(browser)
            yield Console(server, page, config)
            page.close()
            assert not errors, f"the page threw: {errors}"
        finally:
            server.stop()


def test_models_view_lists_both_entries_and_load_makes_one_ready_with_its_memory(console):
    page = console.page
    page.goto(console.url + "/")
    expect(page.locator("#connection")).to_have_text("live")
    rows = page.locator("#models-table tbody tr")
    expect(rows).to_have_count(2)
    tiny = page.locator('#models-table tr[data-model="tiny"]')
    expect(tiny).to_contain_text("tiny-too")
    expect(tiny).to_have_attribute("data-state", "unloaded")
    expect(page.locator('#models-table tr[data-model="smollm2"]')).to_have_attribute("data-state", "unloaded")
    assert console.row("tiny")["state"] == "unloaded"

    page.get_by_role("button", name="Load tiny", exact=True).click()
    expect(tiny).to_have_attribute("data-state", "ready", timeout=60_000)
    row = console.row("tiny")
    assert row["state"] == "ready" and row["memory_bytes"] > 0
    shown = tiny.locator('[data-field="memory"]').inner_text()  # e.g. "2.3 MiB" or "12 MiB"
    number, unit = shown.split()
    scale = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    assert abs(float(number) * scale - row["memory_bytes"]) <= 0.05 * row["memory_bytes"] + scale / 10
    expect(page.locator("#models-summary")).to_contain_text("1 ready")
    console.shot("models")

    page.set_viewport_size({"width": 400, "height": 800})  # a phone: rows become cards
    overflow = page.evaluate("document.scrollingElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the narrow page scrolls sideways by {overflow}px"
    console.shot("models-narrow")
    page.set_viewport_size({"width": 1280, "height": 800})


def test_tabs_work_from_the_keyboard(console):
    page = console.page
    page.locator("#tab-models").focus()
    page.keyboard.press("ArrowRight")
    expect(page.locator("#tab-activity")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#view-activity")).to_be_visible()
    expect(page.locator("#view-models")).to_be_hidden()
    page.keyboard.press("End")
    expect(page.locator("#tab-playground")).to_be_focused()
    expect(page.locator("#view-playground")).to_be_visible()


def test_playground_streams_token_by_token_and_stop_cancels_the_request(console):
    page = console.page
    page.goto(console.url + "/#playground")
    options = page.locator("#pg-model option")  # one per entry, its other aliases beside it
    expect(options).to_have_count(2)
    expect(options.first).to_have_text("tiny (also tiny-too)")
    expect(options.nth(1)).to_have_text("smollm2")
    page.get_by_label("Model", exact=True).select_option("smollm2")
    page.get_by_label("Temperature", exact=True).fill("0")
    page.get_by_label("max_tokens", exact=True).fill("400")
    page.get_by_label("Message", exact=True).fill("Write a long story about a lighthouse keeper.")
    page.locator("#pg-raw summary").click()
    expect(page.locator("#pg-curl")).to_contain_text('"model":"smollm2"')
    expect(page.locator("#pg-curl")).to_contain_text("/v1/chat/completions")

    page.get_by_role("button", name="Send").click()
    reply = page.locator("#transcript li.assistant .text").last
    seen: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(set(seen)) < 6:
        seen.append(len(reply.inner_text()))
        page.wait_for_timeout(50)
    lengths = sorted(set(seen) - {0})
    assert len(lengths) >= 5, f"the reply did not arrive piece by piece: lengths {seen}"
    assert seen == sorted(seen), "the reply's text only grows"
    assert console.row("smollm2")["in_flight"] == 1  # still generating when we stop it

    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#pg-status")).to_have_text("stopped")
    expect(page.locator("#transcript li.assistant .stats").last).to_contain_text("finish: stopped")
    deadline = time.monotonic() + 10
    while (row := console.row("smollm2"))["in_flight"] + row["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    row = console.row("smollm2")
    assert row["in_flight"] == 0 and row["active"] == 0, row
    stopped_at = len(reply.inner_text())
    page.wait_for_timeout(500)
    assert len(reply.inner_text()) == stopped_at, "text kept coming after stop"
    # and the page's models table agrees the model is idle again
    page.locator("#tab-models").click()
    requests = page.locator('#models-table tr[data-model="smollm2"] [data-field="requests"]')
    expect(requests).to_have_text("0 / 0 / 0")

    # A prompt longer than one step's prompt budget (128 tokens) is read in steps, and the page
    # says how far it got; it records every status line it shows here.
    page.locator("#tab-playground").click()
    page.get_by_label("max_tokens", exact=True).fill("6")
    page.get_by_label("System prompt", exact=True).fill("Answer in plain words. " * 60)
    page.get_by_label("Message", exact=True).fill("And then?")
    page.evaluate("""() => { const s = document.getElementById("pg-status"); window.statuses = [];
        new MutationObserver(() => window.statuses.push(s.textContent))
            .observe(s, {childList: true, characterData: true, subtree: true}); }""")
    page.get_by_role("button", name="Send").click()
    stats = page.locator("#transcript li.assistant .stats").last
    expect(stats).to_contain_text("6 completion", timeout=60_000)
    expect(stats).to_contain_text("finish: length")
    expect(stats).to_contain_text("tokens/s")
    prompt_tokens = int(re.search(r"usage: (\d+) prompt", stats.inner_text()).group(1))
    progress = [tuple(map(int, m.groups())) for s in page.evaluate("window.statuses")
                if (m := re.match(r"reading the prompt: (\d+) / (\d+) tokens", s))]
    assert progress, page.evaluate("window.statuses")
    assert all(total == prompt_tokens and 0 < done <= total for done, total in progress), progress
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert prompt_tokens > 128
    console.shot("playground")


def _metric(console: Console, name: str, model: str) -> float:
    text = httpx.get(console.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples
                       if s.labels.get("model") == model and s.name.endswith("_total"))
    return 0.0


def test_activity_view_shows_the_servers_counts(console):
    page = console.page
    page.locator("#tab-activity").click()
    row = page.locator('#activity-table tr[data-model="smollm2"]')
    generated = int(_metric(console, "modelyard_completion_tokens", "smollm2"))
    prompt = int(_metric(console, "modelyard_prompt_tokens", "smollm2"))
    expect(row).to_contain_text(f"{prompt} / {generated}", timeout=10_000)
    expect(page.locator("#activity-chart polyline").first).to_be_attached()
    console.shot("activity")
    page.locator("#tab-models").click()  # both models used: the docs' picture (docs/images/)
    expect(page.locator("#models-summary")).to_contain_text("2 ready")
    page.set_viewport_size({"width": 1200, "height": 340})
    console.shot("overview", full_page=False)
    page.set_viewport_size({"width": 1280, "height": 800})


def test_a_page_opened_after_the_traffic_draws_it_from_the_servers_history(console, browser):
    """The traffic of the tests above happened while no page showed Activity; a page opened now
    draws it at once from /metrics/activity, before its own 2 s samples could make a rate."""
    history = console.api("/metrics/activity")
    assert history["window"] == 900
    generated = history["samples"][-1]["models"]["smollm2"]["completion"]
    assert generated == _metric(console, "modelyard_completion_tokens", "smollm2") > 0
    page, errors = new_page(browser)
    try:
        page.goto(console.url + "/#activity")
        points = page.locator("#activity-chart polyline").first
        expect(points).to_be_attached(timeout=1_500)  # sooner than two live samples
        assert len(points.get_attribute("points").split()) >= 2
    finally:
        page.close()
    assert not errors, f"the page threw: {errors}"


def test_a_broken_config_file_shows_its_error_and_line_within_seconds(console):
    page = console.page
    page.locator("#tab-config").click()
    expect(page.locator("#config-facts")).to_contain_text(str(console.config))
    expect(page.locator("#config-facts")).to_contain_text("polling")
    good = console.config.read_text()
    lines = good.splitlines(keepends=True)
    assert lines[BROKEN_LINE - 1].strip().startswith("n_ctx:")
    lines[BROKEN_LINE - 1] = BROKEN
    console.config.write_text("".join(lines))
    record = page.locator("#reload-record")
    expect(record).to_contain_text("Failed", timeout=5_000)
    error = record.locator("li.config-error").first
    expect(error).to_contain_text(f"line {BROKEN_LINE}:")
    expect(error).to_contain_text(f"{console.config.name}:{BROKEN_LINE}:")
    expect(error).to_contain_text("n_ctx")
    console.shot("config")

    console.config.write_text(good)  # fixed: the next reload applies and keeps the loaded models
    expect(record).to_contain_text("Applied", timeout=5_000)
    expect(record).to_contain_text("Kept loaded")
    page.get_by_role("button", name="Reload config now").click()
    expect(record).to_contain_text("(admin)")


# ------------------------------------------------------------------------------- API keys

ADMIN_KEY = "sk-console-admin-4c1f9e"
APP_KEY = "sk-console-app-77d2a0"


def test_the_page_asks_for_a_key_on_401_sends_it_and_never_shows_it(browser, tmp_path):
    from tests.support.fakes import Loader
    from tests.support.ggufgen import write_servable

    class SlowLoader(Loader):
        def __call__(self, entry: Any) -> Any:
            time.sleep(1.5)  # in the registry's worker thread: long enough to watch
            return super().__call__(entry)

    for name in ("a", "b"):
        write_servable(tmp_path / f"{name}.gguf")
    config = tmp_path / "modelyard.yaml"
    config.write_text(f"""\
auth:
  admin_key: {ADMIN_KEY}
  keys:
    - name: app
      key: {APP_KEY}
models:
  - model: a.gguf
    aliases: [a]
  - model: b.gguf
    aliases: [b]
""")

    class Server(ThreadedServer):
        ready_path = "/"  # the page needs no key

    server = Server(create_app(load_config(config), loader=SlowLoader()))
    server.start_serving()
    page, errors = new_page(browser)
    try:
        assert httpx.get(server.url + "/admin/models").status_code == 401
        page.goto(server.url + "/")
        dialog = page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("needs an API key")
        key = page.get_by_label("Key", exact=True)
        expect(key).to_be_focused()
        page.keyboard.press("Escape")  # declined: the page says so and does not nag
        expect(dialog).to_be_hidden()
        expect(page.locator("#connection")).to_contain_text("disconnected")
        page.wait_for_timeout(1500)  # longer than the event stream's retry
        expect(dialog).to_be_hidden()

        page.get_by_role("button", name="API key").click()
        expect(dialog).to_be_visible()
        key.fill("wrong-key")
        page.keyboard.press("Enter")
        expect(dialog).to_contain_text("did not accept that key")
        key.fill(APP_KEY)  # a client key: /admin wants the admin key (403)
        page.keyboard.press("Enter")
        expect(dialog).to_contain_text("needs the admin key")
        key.fill(ADMIN_KEY)
        page.get_by_role("button", name="Use key").click()
        expect(dialog).to_be_hidden()
        expect(page.locator("#connection")).to_have_text("live")
        expect(page.locator("#models-table tbody tr")).to_have_count(2)

        page.get_by_role("button", name="Load b", exact=True).click()
        b = page.locator('#models-table tr[data-model="b"]')
        expect(b).to_have_attribute("data-state", "loading")  # live, while the load runs
        expect(b.get_by_role("progressbar")).to_be_visible()
        expect(b).to_have_attribute("data-state", "ready")
        expect(b.get_by_role("progressbar")).to_have_count(0)
        page.locator("#tab-playground").click()
        page.locator("#pg-raw summary").click()
        expect(page.locator("#pg-curl")).to_contain_text("Bearer $MODELYARD_API_KEY")
        # no key anywhere on the page: not in the markup, not in any field's value
        html = page.content()
        values = " ".join(page.evaluate(
            "[...document.querySelectorAll('input,textarea')].map(e => e.value)"))
        for secret in (ADMIN_KEY, APP_KEY, "wrong-key"):
            assert secret not in html and secret not in values
        assert not errors, f"the page threw: {errors}"
    finally:
        page.close()
        server.stop()


# ------------------------------------------------------------------------------- images

def test_the_playground_attaches_an_image_for_a_model_that_takes_images(browser, tmp_path):
    """The picker shows only for an entry /v1/models says takes images; the chosen PNG goes as
    an image_url data: URL of the file's own bytes, the reply comes back, and its usage is what
    the API gives the same request sent without the page. A pasted image attaches too."""
    import base64
    import json

    from tests.support.refs import VLM_DIR

    tiny = write_tiny_llama(tmp_path / "tiny.gguf", seed=4)
    config = tmp_path / "modelyard.yaml"
    config.write_text(f"""\
models:
  - model: {tiny}
    aliases: [tiny]
    n_ctx: 256
  - model: {VLM_DIR / "gemma3_vlm_text_f32.gguf"}
    mmproj: {VLM_DIR / "gemma3_vlm_mmproj_f32.gguf"}
    aliases: [vision]
    n_ctx: 256
""")
    png = VLM_DIR / "image1_64x64.png"
    url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    server = ThreadedServer(create_app(load_config(config)))
    server.start_serving()
    page, errors = new_page(browser)
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data))
            if r.url.endswith("/v1/chat/completions") and r.method == "POST" else None)
    try:
        page.goto(server.url + "/#playground")
        expect(page.locator("#pg-model option")).to_have_count(2)
        page.get_by_label("Model", exact=True).select_option("tiny")
        expect(page.locator("#pg-attach")).to_be_hidden()
        page.get_by_label("Model", exact=True).select_option("vision")
        expect(page.locator("#pg-attach")).to_be_visible()

        page.get_by_label("Attach an image", exact=True).set_input_files(str(png))
        expect(page.locator("#pg-image-preview img")).to_be_visible()
        page.locator("#pg-raw summary").click()
        expect(page.locator("#pg-raw-body")).to_contain_text('"image_url"')
        page.get_by_label("Temperature", exact=True).fill("0")
        page.get_by_label("max_tokens", exact=True).fill("3")
        page.get_by_label("Message", exact=True).fill("What is this?")
        page.get_by_role("button", name="Send").click()
        stats = page.locator("#transcript li.assistant .stats").last
        expect(stats).to_contain_text("finish:", timeout=60_000)
        expect(page.locator("#transcript li.user img")).to_be_visible()
        expect(page.locator("#pg-image-preview img")).to_have_count(0)  # sent: attachment cleared

        content = sent[-1]["messages"][-1]["content"]
        assert content == [{"type": "text", "text": "What is this?"},
                           {"type": "image_url", "image_url": {"url": url}}]
        direct = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "vision", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}).json()
        shown = re.search(r"usage: (\d+) prompt \+ (\d+) completion", stats.inner_text())
        assert int(shown.group(1)) == direct["usage"]["prompt_tokens"]
        text_only = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "vision", "max_tokens": 1,
            "messages": [{"role": "user", "content": "What is this?"}]}).json()
        # the image's rows count: 48 px / patch 8 = 6x6 patches, pooled 2x2 -> 9 (plus markers)
        assert direct["usage"]["prompt_tokens"] >= text_only["usage"]["prompt_tokens"] + 9

        # a pasted image attaches the same way
        page.evaluate("""async (url) => {
            const blob = await (await fetch(url)).blob();
            const dt = new DataTransfer();
            dt.items.add(new File([blob], "pasted.png", {type: "image/png"}));
            document.getElementById("pg-prompt").dispatchEvent(
                new ClipboardEvent("paste", {clipboardData: dt, bubbles: true, cancelable: true}));
        }""", url)
        expect(page.locator("#pg-image-preview img")).to_be_visible()
        page.get_by_role("button", name="Remove image").click()
        expect(page.locator("#pg-image-preview img")).to_have_count(0)
        page.set_viewport_size({"width": 1280, "height": 800})
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "playground-image.png"), full_page=True)
        assert not errors, f"the page threw: {errors}"
    finally:
        page.close()
        server.stop()
