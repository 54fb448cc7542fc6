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
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The trophy did not fit in the suitcase because it was too big."
LAYER, HEAD = 2, 3
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_MS = 90_000  # the first request loads the model; the machine may be busy
SERVED = ("mlm", "sentiment", "ner", "qa", "rerank")  # beside the default model, with these heads:
KINDS = {"all-MiniLM-L6-v2": set(), "mlm": {"fill-mask"}, "sentiment": {"predict"}, "ner": {"ner"}, "qa": {"qa"},
         "rerank": {"predict"}}  # a cross-encoder also classifies (one label)
SEARCH_TEXTS = ["How do I reset my password?", "The invoice was charged twice.", "My parcel never arrived.",
                "Change the e-mail address of my account.", "The app crashes when I open the camera."]


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


def wait_until_up(url: str, process: subprocess.Popen, log: Path, seconds: float = 240) -> None:
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


@contextmanager
def running_server(arguments: list[str], directory: Path) -> Iterator[str]:
    """`encoderkit serve ARGUMENTS` on a free loopback port, one torch thread (the tests share the machine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = directory / f"server-{port}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "encoderkit.cli", "serve", *arguments, "--port", str(port)]
    with log.open("w") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=directory)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url + "/health", process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def post(url: str, body: dict, key: str | None = None):
    """The server's JSON answer, as the page's fetch gets it."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def task_models(browser, tmp_path_factory, minilm_dir) -> dict[str, Path]:
    """The server tests' tiny random model of each head, and an index of a few texts embedded with MiniLM."""
    from encoderkit import Embedder
    from encoderkit.jobs import build_index_job
    from serving import tiny_models

    root = tmp_path_factory.mktemp("studio-models")
    models = tiny_models(root, minilm_dir)
    texts = root / "texts.txt"
    texts.write_text("\n".join(SEARCH_TEXTS) + "\n", encoding="utf-8")
    np.save(root / "texts.npy", Embedder.from_pretrained(minilm_dir).encode(SEARCH_TEXTS))
    build_index_job(root / "texts.npy", root / "index", model=minilm_dir, texts_path=texts)
    return {**models, "index": root / "index"}


@pytest.fixture(scope="module")
def server(browser, task_models, tmp_path_factory):
    arguments = ["default", *(f"--model={name}={task_models[name]}" for name in SERVED),
                 "--index", str(task_models["index"])]
    with running_server(arguments, tmp_path_factory.mktemp("studio-server")) as url:
        yield url


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


@contextmanager
def open_page(browser, url: str, *, wait_for_map: bool = True):
    """A fresh tab on the studio; on leaving, no console error but those the test allowed."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(TIMEOUT_MS)
    opened.console = Console(opened)
    response = opened.goto(url + "/")
    assert response is not None and response.ok, f"GET / answered {response and response.status}"
    if wait_for_map:
        opened.wait_for_selector("#attention-output:not([hidden])")  # the page runs its example on load
    yield opened
    unexpected = opened.console.unexpected()
    context.close()
    assert not unexpected, f"console errors: {unexpected}"


@pytest.fixture
def page(browser, server):
    with open_page(browser, server) as opened:
        yield opened


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
    # One tab stop per map, on the selected row: Tab from the first map reaches the second map's row.
    assert page.locator('#map-causal g.row[tabindex="0"]').count() == 1
    page.keyboard.press("End")
    page.keyboard.press(" ")
    last = len(expected) - 1
    page.wait_for_selector(f'#row-bars table[data-query="{last}"]')
    page.focus(f'#map-bidirectional g.row[data-query="{last}"]')
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.closest('svg').dataset.mask + ':' + "
                         "document.activeElement.dataset.query") == f"causal:{last}"


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


# ----- the task panels -----------------------------------------------------------------------------
PANELS = {"fill-mask": "#fill-mask-panel", "predict": "#classify-panel", "ner": "#ner-panel", "qa": "#qa-panel"}


def choose_model(page, name: str) -> None:
    page.select_option("#model", name)  # the explorer follows the model
    page.wait_for_selector(f'#attention-output[data-model="{name}"]')
    wait_idle(page)


def visible_panels(page) -> set[str]:
    return {kind for kind, selector in PANELS.items() if page.locator(selector).is_visible()}


def listed(page, selector: str) -> list[tuple[str, float]]:
    return [(item["label"], float(item["score"])) for item in page.eval_on_selector_all(
        selector, "items => items.map(i => ({label: i.dataset.label, score: i.dataset.score}))")]


def marks(page, selector: str) -> list[tuple[int, int, str]]:
    return [(int(m["start"]), int(m["end"]), m["label"]) for m in page.eval_on_selector_all(
        selector, "marks => marks.map(m => ({start: m.dataset.start, end: m.dataset.end, label: m.dataset.label}))")]


def test_panels_appear_only_for_models_with_the_head(page):
    assert page.eval_on_selector_all("#model option", "options => options.map(o => o.value)") == list(KINDS)
    for name, kinds in KINDS.items():
        choose_model(page, name)
        assert visible_panels(page) == kinds, name
        assert page.locator("#search-panel").is_visible()  # the server has an index, whatever the model
        layers, heads = (6, 12) if name == "all-MiniLM-L6-v2" else (2, 4)
        assert page.locator("#layer option").count() == layers and page.locator("#head option").count() == heads
        assert name in page.inner_text("#attention-status")


def test_fill_mask_panel_shows_the_servers_answer(page, server):
    choose_model(page, "mlm")
    page.fill("#fill-mask-text", "The capital of France is [MASK].")
    page.fill("#fill-mask-k", "3")
    page.click("#fill-mask-panel button[type=submit]")
    page.wait_for_selector("#fill-mask-result li >> nth=2")
    answer = post(server + "/fill-mask", {"inputs": "The capital of France is [MASK].", "top_k": 3, "model": "mlm"})
    assert listed(page, "#fill-mask-result li") == [(p["token_str"], pytest.approx(p["score"], abs=1e-9)) for p in answer]
    assert answer[0]["sequence"] in page.inner_text("#fill-mask-result")


def test_classify_panel_shows_labels_with_scores(page, server):
    choose_model(page, "sentiment")
    page.fill("#classify-text", "a gripping, beautifully shot film")
    page.click("#classify-panel button[type=submit]")
    page.wait_for_selector("#classify-result li >> nth=2")
    answer = post(server + "/predict", {"inputs": "a gripping, beautifully shot film", "model": "sentiment"})
    shown = listed(page, "#classify-result li")
    assert shown == [(p["label"], pytest.approx(p["score"], abs=1e-9)) for p in answer]
    assert [label for label, _ in shown] != [] and shown[0][1] >= shown[-1][1]
    widths = page.eval_on_selector_all("#classify-result .bar-fill", "bars => bars.map(b => b.style.width)")
    assert [float(w.rstrip("%")) for w in widths] == [pytest.approx(100 * p["score"], abs=0.01) for p in answer]


def test_ner_panel_highlights_the_entities(page, server):
    text = "Peter Blackburn flew to Brussels on Monday."
    choose_model(page, "ner")
    page.fill("#ner-text", text)
    page.click("#ner-panel button[type=submit]")
    page.wait_for_selector("#ner-result p.muted")
    entities = post(server + "/ner", {"inputs": text, "model": "ner"})
    assert entities, "the tiny tagger finds no entity in the example: pick another text"
    assert marks(page, "#ner-result mark.span") == [(e["start"], e["end"], e["label"]) for e in entities]
    shown_text = page.eval_on_selector("#ner-result .marked-text",
                                       "p => Array.from(p.childNodes, n => n.nodeType === 3 ? n.textContent : "
                                       "n.firstChild.textContent).join('')")
    assert shown_text == text  # the text is whole: the marks wrap its spans
    assert page.locator("#ner-result mark.span .span-label").first.inner_text() == entities[0]["label"]


def test_qa_panel_highlights_the_answer(page, server):
    question, context = "Where did Peter fly to?", "Peter Blackburn flew to Brussels on Monday to meet the committee."
    choose_model(page, "qa")
    page.fill("#qa-question", question)
    page.fill("#qa-context", context)
    page.click("#qa-panel button[type=submit]")
    answer = post(server + "/qa", {"question": question, "context": context, "model": "qa"})
    assert answer["answer"], "the tiny reader gives no answer: pick another example"
    page.wait_for_selector("#qa-result mark.span")
    assert marks(page, "#qa-result mark.span") == [(answer["start"], answer["end"], "answer")]
    assert page.inner_text("#qa-result strong") == answer["answer"] == context[answer["start"]:answer["end"]]


def test_search_panel_lists_the_nearest_texts(page, server):
    page.fill("#search-query", "I forgot my password")
    page.fill("#search-k", "3")
    page.click("#search-panel button[type=submit]")
    page.wait_for_selector("#search-result li >> nth=2")
    hits = post(server + "/search", {"query": "I forgot my password", "k": 3})
    assert listed(page, "#search-result li") == [(str(h["id"]), pytest.approx(h["score"], abs=1e-9)) for h in hits]
    assert "How do I reset my password?" in page.locator("#search-result li").first.inner_text()


def test_a_task_error_is_shown_in_its_panel(page):
    page.console.allow(r"Failed to load resource: the server responded with a status of 422")
    choose_model(page, "mlm")
    page.fill("#fill-mask-text", "There is no mask token here.")
    page.click("#fill-mask-panel button[type=submit]")
    error = page.locator("#fill-mask-panel .error")
    error.wait_for(state="visible")
    assert "no [MASK] token" in error.inner_text() and "HTTP 422" in error.inner_text()
    page.fill("#fill-mask-text", "Paris is the [MASK] of France.")
    page.click("#fill-mask-panel button[type=submit]")
    page.wait_for_selector("#fill-mask-result li")
    assert error.is_hidden()


# ----- an API key ----------------------------------------------------------------------------------
def test_the_page_asks_for_the_api_key_and_sends_it(browser, task_models, tmp_path_factory):
    with running_server([str(task_models["mlm"]), "--api-key", "s3cret"], tmp_path_factory.mktemp("keyed")) as url:
        with open_page(browser, url, wait_for_map=False) as page:
            page.console.allow(r"Failed to load resource: the server responded with a status of 401")
            banner = page.locator("#global-error")
            banner.wait_for(state="visible")
            assert "API key" in banner.inner_text() and "HTTP 401" in banner.inner_text()
            assert page.locator("#auth").get_attribute("open") is not None  # the key field is opened
            page.fill("#api-key", "s3cret")
            page.click("#auth-form button[type=submit]")
            page.wait_for_selector("#attention-output:not([hidden])")
            assert banner.is_hidden()
            assert page.evaluate("() => sessionStorage.getItem('encoderkit.apiKey')") == "s3cret"
            page.reload()  # the key lives as long as the tab
            page.wait_for_selector("#attention-output:not([hidden])")
            page.click("#fill-mask-panel button[type=submit]")
            page.wait_for_selector("#fill-mask-result li")


# ----- a sparse index: the matched terms ---------------------------------------------------------------
def test_search_panel_shows_the_matched_and_expanded_terms(browser, task_models, tmp_path_factory):
    """A server whose index is SPLADE's (the masked-LM serves /embed_sparse): each hit lists the terms it shares
    with the query as /search gives them, expansions (not among the query's tokens) marked."""
    from encoderkit.data.readers import Record
    from encoderkit.retrieval.texts import build_from_texts

    root = tmp_path_factory.mktemp("sparse-studio")
    texts = root / "texts.txt"
    texts.write_text("\n".join(SEARCH_TEXTS) + "\n", encoding="utf-8")
    build_from_texts("sparse", [Record(f"t{i}", t) for i, t in enumerate(SEARCH_TEXTS)], root / "index",
                     model=task_models["mlm"], info={"texts": str(texts)}, show_progress=False)
    with running_server([str(task_models["mlm"]), "--index", str(root / "index")], root) as url:
        with open_page(browser, url, wait_for_map=False) as page:
            page.fill("#search-query", "I forgot my password")
            page.fill("#search-k", "2")
            page.click("#search-panel button[type=submit]")
            page.wait_for_selector("#search-result li >> nth=1")
            hits = post(url + "/search", {"query": "I forgot my password", "k": 2})
            shown = page.eval_on_selector_all("#search-result li", """items => items.map(item =>
                [...item.querySelectorAll('.term')].map(t => [t.dataset.token, Number(t.dataset.product),
                                                              t.classList.contains('expansion')]))""")
            for hit, chips in zip(hits, shown):
                assert [c[0] for c in chips] == [t["token"] for t in hit["terms"]] and chips
                assert [c[1] for c in chips] == pytest.approx(
                    [t["query_weight"] * t["document_weight"] for t in hit["terms"]], rel=1e-6)
                assert [c[2] for c in chips] == [t["expansion"] for t in hit["terms"]]
            assert any(c[2] for chips in shown for c in chips)  # expansion terms are shown as such
