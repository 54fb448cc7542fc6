"""The web studio in a real browser: headless Chromium (the system's, Debian's `chromium`) driven by playwright
against a real server process. What the page shows is checked against what encoderkit computes in Python.

Skipped, with the reason, where playwright or a Chromium is missing (`make test` installs Chromium where it can).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The trophy did not fit in the suitcase because it was too big."
LAYER, HEAD = 2, 3
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_MS = 90_000  # the first request loads the model; the machine may be busy


def chromium_executable() -> str | None:
    """ENCODERKIT_CHROMIUM, or the first Chromium on PATH."""
    configured = os.environ.get("ENCODERKIT_CHROMIUM")
    if configured:
        return configured
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    executable = chromium_executable()
    if executable is None:
        pytest.skip("no Chromium on PATH: install Debian's `chromium` (make test does, as root) or set "
                    "ENCODERKIT_CHROMIUM to a Chromium executable")
    with sync_api.sync_playwright() as playwright:
        # The system browser: playwright's own browser download is not used (and not reachable here).
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the server did not answer {url} within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def start_server(models: dict[str, tuple[Path, list[str]]], directory: Path):
    """The studio's server on a free loopback port, one torch thread (the tests share the machine)."""
    port = free_port()
    log = directory / "server.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
        ENCODERKIT_STUDIO_MODELS=json.dumps({name: [str(path), kinds] for name, (path, kinds) in models.items()}))
    command = [sys.executable, "-m", "uvicorn", "studio_app:app", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning"]
    with log.open("w") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=directory)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url + "/studio/models", process, log)
    except BaseException:
        process.kill()
        raise
    return url, process


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory, minilm_dir):
    directory = tmp_path_factory.mktemp("studio-server")
    url, process = start_server({"all-MiniLM-L6-v2": (minilm_dir, ["embed"])}, directory)
    yield url
    stop_server(process)


@pytest.fixture(scope="module")
def analyzer(minilm_dir):
    from encoderkit.analysis import AttentionAnalyzer

    return AttentionAnalyzer.from_pretrained(minilm_dir)


class Console:
    """The page's console errors and uncaught exceptions; a test allows the ones it provokes."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        self.allowed: list[re.Pattern] = []
        page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(TIMEOUT_MS)
    opened.console = Console(opened)
    opened.goto(server + "/")
    opened.wait_for_selector("#attention-output:not([hidden])")  # the page runs its example on load
    yield opened
    unexpected = opened.console.unexpected()
    context.close()
    assert not unexpected, f"console errors: {unexpected}"


# ----- helpers that read the page -----------------------------------------------------------------
def wait_idle(page) -> None:
    page.wait_for_function("() => !document.querySelector('#attention-panel').hasAttribute('aria-busy')")


def show(page, text: str, layer: int, head: int) -> None:
    """Type the text, choose the layer and head, press the button, and wait for that head's maps."""
    page.fill("#attention-text", text)
    page.select_option("#layer", str(layer))
    page.select_option("#head", str(head))
    page.click("#attention-run")
    page.wait_for_selector(f'#attention-output[data-layer="{layer}"][data-head="{head}"]')
    wait_idle(page)


def shown_tokens(page, mask: str = "bidirectional") -> list[str]:
    return page.eval_on_selector_all(f"#map-{mask} g.row", "rows => rows.map(r => r.dataset.token)")


def shown_matrix(page, mask: str) -> np.ndarray:
    rows = page.eval_on_selector_all(
        f"#map-{mask} g.row", "rows => rows.map(r => Array.from(r.querySelectorAll('rect.cell'), c => Number(c.dataset.weight)))")
    return np.array(rows, dtype=np.float64)


def hover_weight(page, mask: str, query: int, key: int) -> tuple[float, str]:
    """Hover one cell; the weight the tooltip shows (as text) and the tooltip's whole text."""
    page.hover(f'#map-{mask} rect.cell[data-query="{query}"][data-key="{key}"]')
    page.wait_for_selector(f'#tooltip:not([hidden])[data-mask="{mask}"][data-query="{query}"][data-key="{key}"]')
    text = page.inner_text("#tooltip")
    match = re.search(r"weight (\d+\.\d+)", text)
    assert match, text
    return float(match.group(1)), text


# ----- the attention explorer ---------------------------------------------------------------------
def test_heatmap_shows_the_heads_attention(page, analyzer, tmp_path):
    show(page, TEXT, LAYER, HEAD)
    maps = analyzer.attend(TEXT)
    expected = maps.head(LAYER, HEAD)
    assert shown_tokens(page) == maps.tokens
    np.testing.assert_allclose(shown_matrix(page, "bidirectional"), expected, atol=1e-4)
    # What the tooltip says on hover: the strongest cell, a [CLS] column cell and a neighbour.
    strongest = np.unravel_index(np.argmax(expected), expected.shape)
    for query, key in [tuple(int(i) for i in strongest), (5, 0), (7, 6), (len(maps.tokens) - 1, 3)]:
        weight, text = hover_weight(page, "bidirectional", query, key)
        assert weight == pytest.approx(float(expected[query, key]), abs=1e-4)
        assert f"query {query}: {maps.tokens[query]}" in text and f"key {key}: {maps.tokens[key]}" in text
        assert f"layer {LAYER}, head {HEAD}" in text
    page.click('#map-bidirectional g.row[data-query="5"] rect.cell[data-key="2"]')
    page.mouse.move(5, 5)
    shot = page.locator("#attention-panel").screenshot(path=str(tmp_path / "studio-attention.png"))
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "studio-attention.png").stat().st_size > 10_000
    if os.environ.get("ENCODERKIT_STUDIO_SCREENSHOT"):  # refresh the README's picture: set it to a path under docs/
        (ROOT / os.environ["ENCODERKIT_STUDIO_SCREENSHOT"]).write_bytes(shot)


def test_clicking_a_row_shows_its_distribution(page, analyzer):
    show(page, TEXT, LAYER, HEAD)
    expected = analyzer.attend(TEXT).head(LAYER, HEAD)
    causal = analyzer.attend(TEXT, mask="causal").head(LAYER, HEAD)
    query = 3
    page.click(f'#map-bidirectional g.row[data-query="{query}"] rect.cell[data-key="1"]')
    for mask in ("bidirectional", "causal"):  # the row is outlined in both maps
        row = page.locator(f'#map-{mask} g.row[data-query="{query}"]')
        assert row.get_attribute("aria-pressed") == "true" and "selected" in row.get_attribute("class")
        assert page.locator(f"#map-{mask} g.row.selected").count() == 1
        outline = page.locator(f"#map-{mask} rect.row-outline")
        assert outline.get_attribute("visibility") == "visible"
        outline_box, cell_box = outline.bounding_box(), page.locator(
            f'#map-{mask} rect.cell[data-query="{query}"][data-key="0"]').bounding_box()
        assert abs(outline_box["y"] + 1 - cell_box["y"]) < 1.5 and outline_box["height"] >= cell_box["height"]
    table = page.locator(f'#row-bars table[data-query="{query}"]')
    assert table.is_visible()
    for mask, matrix in [("bidirectional", expected), ("causal", causal)]:
        shown = np.array([float(v) for v in table.locator(f'tbody td[data-mask="{mask}"]').evaluate_all(
            "cells => cells.map(c => c.dataset.weight)")])
        np.testing.assert_allclose(shown, matrix[query], atol=1e-4)
        assert shown.sum() == pytest.approx(1.0, abs=1e-4)
        assert float(table.locator(f'tfoot td[data-mask="{mask}"]').get_attribute("data-sum")) == pytest.approx(1.0, abs=1e-4)
        assert table.locator(f'tfoot td[data-mask="{mask}"]').inner_text() == "1.0000"
    assert "did" in page.inner_text("#row-hint")
    # The keyboard does the same: focus the row, move down a row, press Enter.
    page.focus(f'#map-causal g.row[data-query="{query}"]')
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_selector(f'#row-bars table[data-query="{query + 1}"]')
    assert page.locator(f'#map-bidirectional g.row[data-query="{query + 1}"]').get_attribute("aria-pressed") == "true"
    assert page.locator("#map-causal rect.focus-outline").get_attribute("visibility") == "visible"


def test_causal_view_masks_the_future(page, analyzer):
    show(page, TEXT, LAYER, HEAD)
    both, causal = shown_matrix(page, "bidirectional"), shown_matrix(page, "causal")
    assert np.triu(causal, 1).max() == 0 and np.tril(causal).min() >= 0
    np.testing.assert_allclose(causal.sum(axis=1), 1.0, atol=1e-4)
    assert np.abs(both - causal).max() > 0.05  # not the same map
    np.testing.assert_allclose(causal, analyzer.attend(TEXT, mask="causal").head(LAYER, HEAD), atol=1e-4)
    assert page.locator('#map-causal rect.cell.masked').count() == len(causal) * (len(causal) - 1) // 2
    weight, text = hover_weight(page, "causal", 2, 5)
    assert weight == 0 and "masked" in text


def test_statistics_panel_matches_python(page, analyzer):
    show(page, TEXT, LAYER, HEAD)
    for mask in ("bidirectional", "causal"):
        stats = analyzer.attend(TEXT, mask=mask).statistics()
        for category in ["cls", "sep", "self", "previous", "next", "other"]:
            cell = page.locator(f'#stats-table tr[data-category="{category}"] td[data-mask="{mask}"]')
            expected = float(stats.shares[category][LAYER, HEAD])
            assert float(cell.get_attribute("data-value")) == pytest.approx(expected, abs=1e-6)
            assert cell.inner_text().strip() == f"{100 * expected:.1f}%"
        entropy = page.locator(f'#stats-table tr[data-category="entropy"] td[data-mask="{mask}"]')
        assert float(entropy.get_attribute("data-value")) == pytest.approx(float(stats.entropy[LAYER, HEAD]), abs=1e-6)


def test_changing_layer_and_head_updates_the_map(page, analyzer):
    show(page, TEXT, LAYER, HEAD)
    page.click('#map-bidirectional g.row[data-query="4"] rect.cell[data-key="0"]')
    maps = analyzer.attend(TEXT)
    for layer, head in [(4, HEAD), (4, 0), (0, 11)]:
        if page.input_value("#layer") != str(layer):
            page.select_option("#layer", str(layer))  # a change runs the explorer: no button press
        if page.input_value("#head") != str(head):
            page.select_option("#head", str(head))
        page.wait_for_selector(f'#attention-output[data-layer="{layer}"][data-head="{head}"]')
        wait_idle(page)
        np.testing.assert_allclose(shown_matrix(page, "bidirectional"), maps.head(layer, head), atol=1e-4)
        assert f"layer {layer}, head {head}" in page.inner_text("#attention-status")
        # The same input: the selected row stays selected, its table follows the head.
        shown = page.locator('#row-bars table[data-query="4"] tbody td[data-mask="bidirectional"]').evaluate_all(
            "cells => cells.map(c => Number(c.dataset.weight))")
        np.testing.assert_allclose(shown, maps.head(layer, head)[4], atol=1e-4)


def test_an_error_is_shown_and_the_page_keeps_working(page, analyzer):
    page.console.allow(r"Failed to load resource: the server responded with a status of 4(22|13)")
    page.fill("#attention-text", "   ")
    page.click("#attention-run")
    error = page.locator("#attention-error")
    error.wait_for(state="visible")
    assert "empty" in error.inner_text() and "HTTP 422" in error.inner_text()
    page.fill("#attention-text", "word " * 300)
    page.click("#attention-run")
    page.wait_for_function("() => document.querySelector('#attention-error').textContent.includes('413')")
    assert "at most 128 tokens" in error.inner_text()
    show(page, "A short one.", 1, 1)
    assert error.is_hidden()
    assert shown_tokens(page) == analyzer.attend("A short one.").tokens
