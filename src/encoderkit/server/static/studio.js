// encoderkit studio: the attention explorer and the task panels. Plain browser JavaScript, no libraries,
// nothing loaded from elsewhere. Text from the user or the server is only ever set as textContent.
"use strict";

(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const KEY_STORAGE = "encoderkit.apiKey";
  const MASKS = ["bidirectional", "causal"];
  // Sequential blue ramp (light to dark) for attention weights.
  const RAMP = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];

  const state = {info: null, result: null, selectedRow: null, attentionRequest: 0};
  const $ = (id) => document.getElementById(id);

  // ----- talking to the server ---------------------------------------------------------------
  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  function apiKey() {
    try {
      return sessionStorage.getItem(KEY_STORAGE) || "";
    } catch (err) {
      return "";
    }
  }

  async function api(path, body) {
    const headers = {Accept: "application/json"};
    const options = {method: body === undefined ? "GET" : "POST", headers: headers};
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const key = apiKey();
    if (key) headers.Authorization = "Bearer " + key;
    let response;
    try {
      response = await fetch(path, options);
    } catch (err) {
      throw new ApiError("cannot reach the server: " + err.message, 0);
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (err) {
      data = null;
    }
    if (!response.ok) throw new ApiError(errorMessage(response, data, text), response.status);
    if (data === null) throw new ApiError(path + " answered with something that is not JSON", response.status);
    return data;
  }

  // The server answers {"error", "error_type"}; FastAPI's own validation answers {"detail": [...]}.
  function errorMessage(response, data, text) {
    let message = "";
    if (data && typeof data === "object") {
      if (typeof data.error === "string") message = data.error;
      else if (typeof data.detail === "string") message = data.detail;
      else if (Array.isArray(data.detail)) {
        message = data.detail.map((item) => {
          const where = Array.isArray(item.loc) ? item.loc.filter((part) => part !== "body").join(".") : "";
          return (where ? where + ": " : "") + item.msg;
        }).join("; ");
      }
    }
    if (!message) message = (text || response.statusText || "no answer").slice(0, 300);
    if (response.status === 401 || response.status === 403) {
      message += ". This server needs an API key: enter it under \u201cAPI key\u201d at the top.";
      $("auth").open = true;
    }
    return message + " (HTTP " + response.status + ")";
  }

  function showError(element, message) {
    element.textContent = message;
    element.hidden = false;
  }

  function clearError(element) {
    element.textContent = "";
    element.hidden = true;
  }

  // ----- small DOM helpers -------------------------------------------------------------------
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name === "className") node.className = value;
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function svg(tag, attributes) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
    return node;
  }

  function fixed(value, digits) {
    return Number(value).toFixed(digits === undefined ? 6 : digits);
  }

  function scoreBar(score, max) {
    const bar = el("span", {className: "bar"});
    const fill = el("span", {className: "bar-fill"});
    const share = max > 0 ? Math.max(0, Math.min(1, score / max)) : 0;
    fill.style.width = (100 * share).toFixed(2) + "%";
    bar.append(fill);
    return bar;
  }

  function color(value, max) {
    const t = max > 0 ? Math.max(0, Math.min(1, value / max)) : 0;
    const position = t * (RAMP.length - 1);
    const low = Math.min(RAMP.length - 2, Math.floor(position));
    const mix = position - low;
    const rgb = RAMP[low].map((channel, i) => Math.round(channel + (RAMP[low + 1][i] - channel) * mix));
    return "rgb(" + rgb.join(",") + ")";
  }

  function shortToken(token) {
    return token.length > 14 ? token.slice(0, 13) + "\u2026" : token;
  }

  // ----- models ------------------------------------------------------------------------------
  async function loadModels() {
    const banner = $("global-error");
    try {
      state.info = await api("/studio/models");
    } catch (err) {
      showError(banner, "Could not list the models: " + err.message);
      return;
    }
    clearError(banner);
    const select = $("model");
    const previous = select.value;
    select.replaceChildren();
    for (const model of state.info.models) {
      const label = model.name + (model.name === state.info.default ? " (default)" : "");
      select.append(el("option", {value: model.name, text: label}));
    }
    const names = state.info.models.map((model) => model.name);
    select.value = names.includes(previous) ? previous : state.info.default;
    select.disabled = false;
    $("attention-text").maxLength = state.info.limits.max_chars;
    $("attention-pair").maxLength = state.info.limits.max_chars;
    onModelChange();
  }

  function currentModel() {
    if (!state.info) return null;
    return state.info.models.find((model) => model.name === $("model").value) || null;
  }

  function fillNumbers(select, count) {
    const previous = Number(select.value);
    select.replaceChildren();
    for (let i = 0; i < count; i++) select.append(el("option", {value: String(i), text: String(i)}));
    select.value = String(Number.isInteger(previous) && previous < count ? previous : 0);
  }

  function onModelChange() {
    const model = currentModel();
    if (!model) return;
    const serves = model.kinds.length ? model.kinds.join(", ") : "attention only";
    $("model-info").textContent = model.family + ", " + model.layers + " layers \u00d7 " + model.heads +
      " heads; serves " + serves;
    fillNumbers($("layer"), model.layers);
    fillNumbers($("head"), model.heads);
    for (const panel of document.querySelectorAll("section.task")) {
      const kind = panel.dataset.kind;
      panel.hidden = kind === "search" ? !state.info.search : !model.kinds.includes(kind);
    }
    const fillText = $("fill-mask-text");
    if (model.mask_token) {
      fillText.value = fillText.value.replace(/\[MASK\]|<mask>/g, model.mask_token);
      $("fill-mask-title").textContent = "Fill the mask (" + model.mask_token + ")";
    }
    state.result = null;
    state.selectedRow = null;
    runAttention();
  }

  // ----- the attention explorer --------------------------------------------------------------
  async function runAttention() {
    const model = currentModel();
    if (!model) return;
    const request = ++state.attentionRequest;
    const errorBox = $("attention-error");
    const body = {
      text: $("attention-text").value, model: model.name,
      layer: Number($("layer").value), head: Number($("head").value),
    };
    const pair = $("attention-pair").value;
    if (pair.trim()) body.pair = pair;
    $("attention-panel").setAttribute("aria-busy", "true");
    $("attention-status").textContent = "Running " + model.name + "\u2026";
    try {
      const result = await api("/studio/attention", body);
      if (request !== state.attentionRequest) return;  // a newer request is under way
      clearError(errorBox);
      const sameInput = state.result && state.result.model === result.model &&
        state.result.tokens.join("\u0000") === result.tokens.join("\u0000");
      const keepRow = sameInput ? state.selectedRow : null;
      state.result = result;
      state.selectedRow = null;
      renderAttention(result);
      if (keepRow !== null) selectRow(keepRow);
      $("attention-status").textContent = result.model + ": layer " + result.layer + ", head " + result.head +
        " of " + result.layers + " \u00d7 " + result.heads + "; " + result.tokens.length + " tokens.";
    } catch (err) {
      if (request !== state.attentionRequest) return;
      showError(errorBox, err.message);
      $("attention-status").textContent = "";
    } finally {
      if (request === state.attentionRequest) $("attention-panel").removeAttribute("aria-busy");
    }
  }

  function renderAttention(result) {
    const output = $("attention-output");
    // One colour scale for both maps, so they compare. The causal map's first row is always 1 (the first
    // token sees only itself): left out of the scale, or it would wash every other cell out.
    let top = 0;
    for (const mask of MASKS) {
      result[mask].forEach((row, query) => {
        if (mask === "causal" && query === 0) return;
        for (const value of row) top = Math.max(top, value);
      });
    }
    if (top === 0) top = 1;
    for (const mask of MASKS) {
      const holder = document.querySelector("#map-" + mask + " .heatmap");
      holder.replaceChildren(drawHeatmap(result, mask, top));
    }
    $("legend-max").textContent = fixed(top, 3);
    renderStatistics(result.statistics);
    $("row-bars").replaceChildren();
    $("row-hint").textContent = "No row selected yet: click a row of either map.";
    output.dataset.model = result.model;
    output.dataset.layer = String(result.layer);
    output.dataset.head = String(result.head);
    output.dataset.tokens = String(result.tokens.length);
    output.hidden = false;
  }

  function drawHeatmap(result, mask, top) {
    const tokens = result.tokens;
    const matrix = result[mask];
    const n = tokens.length;
    const special = new Set(result.special);
    const cell = Math.max(8, Math.min(26, Math.floor(440 / n)));
    const font = Math.max(7, Math.min(12, cell - 2));
    const longest = Math.max(...tokens.map((token) => shortToken(token).length));
    const margin = Math.ceil(longest * font * 0.62) + 10;
    const width = margin + n * cell + 2;
    const height = margin + n * cell + 2;
    const root = svg("svg", {
      width: width, height: height, viewBox: "0 0 " + width + " " + height, class: "heatmap-svg",
      "data-mask": mask, role: "group",
      "aria-label": mask + " attention, layer " + result.layer + ", head " + result.head +
        ": rows are query tokens, columns key tokens",
    });
    root.style.fontSize = font + "px";
    for (let key = 0; key < n; key++) {
      const x = margin + key * cell + cell / 2 + font / 3;
      const label = svg("text", {
        x: x, y: margin - 6, transform: "rotate(-90 " + x + " " + (margin - 6) + ")",
        class: "key-label" + (special.has(key) ? " special" : ""), "data-key": key,
      });
      label.textContent = shortToken(tokens[key]);
      root.append(label);
    }
    for (let query = 0; query < n; query++) {
      const row = svg("g", {
        class: "row", "data-query": query, "data-token": tokens[query], tabindex: query === 0 ? "0" : "-1", role: "button",
        "aria-pressed": "false",
        "aria-label": "query token " + query + ", " + tokens[query] + ": show where it looks",
      });
      const y = margin + query * cell;
      const label = svg("text", {
        x: margin - 6, y: y + cell / 2, class: "query-label" + (special.has(query) ? " special" : ""),
        "text-anchor": "end", "dominant-baseline": "central",
      });
      label.textContent = shortToken(tokens[query]);
      row.append(label);
      for (let key = 0; key < n; key++) {
        const value = matrix[query][key];
        const masked = mask === "causal" && key > query;
        row.append(svg("rect", {
          x: margin + key * cell, y: y, width: cell, height: cell,
          fill: masked ? "#e9e9ef" : color(value, top), class: masked ? "cell masked" : "cell",
          "data-query": query, "data-key": key, "data-weight": String(value),
        }));
      }
      root.append(row);
    }
    root.append(svg("rect", {class: "row-outline", x: margin - 1, y: 0, width: n * cell + 2, height: cell + 2,
      visibility: "hidden"}));
    root.append(svg("rect", {class: "focus-outline", x: margin - 1, y: 0, width: n * cell + 2, height: cell + 2,
      visibility: "hidden"}));
    root.dataset.margin = String(margin);
    root.dataset.cell = String(cell);
    return root;
  }

  function outline(root, className, query) {
    const box = root.querySelector("rect." + className);
    if (query === null) {
      box.setAttribute("visibility", "hidden");
      return;
    }
    const margin = Number(root.dataset.margin);
    const cell = Number(root.dataset.cell);
    box.setAttribute("y", String(margin + query * cell - 1));
    box.setAttribute("visibility", "visible");
  }

  function selectRow(query) {
    const result = state.result;
    if (!result || query < 0 || query >= result.tokens.length) return;
    state.selectedRow = query;
    for (const root of document.querySelectorAll("svg.heatmap-svg")) {
      for (const row of root.querySelectorAll("g.row")) {
        const selected = Number(row.dataset.query) === query;
        row.classList.toggle("selected", selected);
        row.setAttribute("aria-pressed", selected ? "true" : "false");
        row.setAttribute("tabindex", selected ? "0" : "-1");
      }
      outline(root, "row-outline", query);
    }
    renderRow(result, query);
  }

  function renderRow(result, query) {
    const tokens = result.tokens;
    const sums = {};
    const table = el("table", {className: "row-table", "data-query": String(query)});
    table.append(el("thead", {}, el("tr", {},
      el("th", {scope: "col", text: "key token"}),
      el("th", {scope: "col", text: "bidirectional"}),
      el("th", {scope: "col", text: "causal"}))));
    const body = el("tbody");
    for (let key = 0; key < tokens.length; key++) {
      const line = el("tr", {"data-key": String(key)}, el("th", {scope: "row", text: key + " " + tokens[key]}));
      if (key === query) line.className = "self";
      for (const mask of MASKS) {
        const value = result[mask][query][key];
        sums[mask] = (sums[mask] || 0) + value;
        const cellNode = el("td", {"data-mask": mask, "data-weight": String(value)}, scoreBar(value, 1),
          el("span", {className: "number", text: fixed(value, 4)}));
        line.append(cellNode);
      }
      body.append(line);
    }
    table.append(body);
    const foot = el("tr", {}, el("th", {scope: "row", text: "sum"}));
    for (const mask of MASKS) foot.append(el("td", {"data-mask": mask, "data-sum": String(sums[mask]), text: fixed(sums[mask], 4)}));
    table.append(el("tfoot", {}, foot));
    $("row-bars").replaceChildren(table);
    $("row-hint").textContent = "Query token " + query + ", \u201c" + tokens[query] + "\u201d: its attention over the " +
      tokens.length + " key tokens under each mask (each column sums to 1).";
  }

  function renderStatistics(statistics) {
    const body = document.querySelector("#stats-table tbody");
    body.replaceChildren();
    const names = statistics.categories.concat(["entropy"]);
    for (const name of names) {
      const isEntropy = name === "entropy";
      const label = isEntropy ? "entropy (nats)" : name;
      const head = el("th", {scope: "row", text: label,
        title: isEntropy ? "uniform attention over these tokens would give " + fixed(statistics.uniform_entropy, 3)
          : statistics.descriptions[name]});
      const line = el("tr", {"data-category": name}, head);
      for (const mask of MASKS) {
        const value = statistics[mask][name];
        const shown = isEntropy ? fixed(value, 3) : (100 * value).toFixed(1) + "%";
        const max = isEntropy ? Math.max(statistics.uniform_entropy, 1e-9) : 1;
        line.append(el("td", {"data-mask": mask, "data-value": String(value)}, scoreBar(value, max),
          el("span", {className: "number", text: shown})));
      }
      body.append(line);
    }
  }

  function tooltipFor(target, event) {
    const tip = $("tooltip");
    const result = state.result;
    if (!target || !result) {
      tip.hidden = true;
      return;
    }
    const root = target.closest("svg");
    const mask = root.dataset.mask;
    const query = Number(target.dataset.query);
    const key = Number(target.dataset.key);
    const weight = target.dataset.weight;
    const masked = target.classList.contains("masked");
    tip.replaceChildren(
      el("div", {className: "tt-mask", text: mask + ", layer " + result.layer + ", head " + result.head}),
      el("div", {className: "tt-query", text: "query " + query + ": " + result.tokens[query]}),
      el("div", {className: "tt-key", text: "key " + key + ": " + result.tokens[key]}),
      el("div", {className: "tt-weight", text: "weight " + fixed(weight, 6) + (masked ? " (masked: a later token)" : "")}));
    tip.dataset.mask = mask;
    tip.dataset.query = String(query);
    tip.dataset.key = String(key);
    tip.dataset.weight = weight;
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = Math.max(4, x) + "px";
    tip.style.top = Math.max(4, y) + "px";
  }

  const ROW_KEYS = {
    ArrowDown: (query) => query + 1, ArrowUp: (query) => query - 1, Home: () => 0, End: (query, count) => count - 1,
  };

  function focusRow(row) {
    for (const other of row.parentNode.querySelectorAll('g.row[tabindex="0"]')) other.setAttribute("tabindex", "-1");
    row.setAttribute("tabindex", "0");
    row.focus();
  }

  function bindHeatmaps() {
    const maps = document.querySelector("#attention-output .maps");
    maps.addEventListener("mousemove", (event) => {
      const target = event.target instanceof Element ? event.target.closest("rect.cell") : null;
      tooltipFor(target, event);
    });
    maps.addEventListener("mouseleave", () => {
      $("tooltip").hidden = true;
    });
    maps.addEventListener("click", (event) => {
      const row = event.target instanceof Element ? event.target.closest("g.row") : null;
      if (row) selectRow(Number(row.dataset.query));
    });
    maps.addEventListener("keydown", (event) => {
      const row = event.target instanceof Element ? event.target.closest("g.row") : null;
      if (!row) return;
      const query = Number(row.dataset.query);
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        selectRow(query);
      } else if (event.key in ROW_KEYS) {
        // One tab stop per map (a roving tabindex): the arrows, Home and End move between its rows.
        event.preventDefault();
        const rows = row.parentNode.querySelectorAll("g.row");
        const target = Math.max(0, Math.min(rows.length - 1, ROW_KEYS[event.key](query, rows.length)));
        focusRow(rows[target]);
      }
    });
    maps.addEventListener("focusin", (event) => {
      const row = event.target instanceof Element ? event.target.closest("g.row") : null;
      // Keyboard focus only: a click selects the row, which has an outline of its own.
      if (row && row.matches(":focus-visible")) outline(row.closest("svg"), "focus-outline", Number(row.dataset.query));
    });
    maps.addEventListener("focusout", (event) => {
      const root = event.target instanceof Element ? event.target.closest("svg") : null;
      if (root) outline(root, "focus-outline", null);
    });
  }

  // ----- task panels -------------------------------------------------------------------------
  function firstList(data) {
    // One input may come back as [items] or as [[items]] (a batch of one).
    return Array.isArray(data) && data.length && Array.isArray(data[0]) ? data[0] : data;
  }

  function markedText(text, spans) {
    // The text with each span (character offsets, sorted, overlaps dropped) in a <mark> with its label.
    const paragraph = el("p", {className: "marked-text"});
    let position = 0;
    const sorted = spans.slice().sort((a, b) => a.start - b.start);
    for (const span of sorted) {
      if (span.start < position || span.end <= span.start || span.end > text.length) continue;
      paragraph.append(text.slice(position, span.start));
      const mark = el("mark", {className: "span", "data-label": span.label, "data-start": String(span.start),
        "data-end": String(span.end), title: span.label + " (" + fixed(span.score, 3) + ")"},
      text.slice(span.start, span.end), el("span", {className: "span-label", text: span.label}));
      paragraph.append(mark);
      position = span.end;
    }
    paragraph.append(text.slice(position));
    return paragraph;
  }

  function matchedTerms(terms) {
    // A sparse (SPLADE) hit: the terms the query shares with the document, largest contribution first; terms the
    // query's vector expanded to (not among its own tokens) are marked as expansions.
    const box = el("div", {className: "terms", "aria-label": "matched terms"});
    if (!terms.length) box.append(el("span", {className: "muted", text: "no sparse term in common"}));
    for (const term of terms) {
      const product = term.query_weight * term.document_weight;
      box.append(el("span", {
        className: term.expansion ? "term expansion" : "term",
        "data-token": term.token, "data-product": String(product),
        title: (term.expansion ? "expansion term; " : "query term; ") + "query weight " + fixed(term.query_weight, 3) +
          " x document weight " + fixed(term.document_weight, 3),
        text: term.token + " " + fixed(product, 2)}));
    }
    return box;
  }

  function scoredList(items, describe) {
    // Scores are probabilities (or cosines): a bar is the score out of 1.
    const list = el("ol", {className: "scored"});
    for (const item of items) {
      const parts = describe(item);
      list.append(el("li", {"data-label": parts.label, "data-score": String(item.score)},
        el("span", {className: "label", text: parts.label}), scoreBar(item.score, 1),
        el("span", {className: "number", text: fixed(item.score, 4)}),
        ...(parts.detail ? [el("span", {className: "detail", text: parts.detail})] : []),
        ...(parts.extra ? [parts.extra] : [])));
    }
    return list;
  }

  const TASKS = {
    "fill-mask": {
      path: "/fill-mask",
      body: (model) => ({inputs: $("fill-mask-text").value, top_k: Number($("fill-mask-k").value) || 5, model: model}),
      render: (data) => {
        const groups = Array.isArray(data) && data.length && Array.isArray(data[0]) ? data : [data];
        const box = el("div");
        groups.forEach((group, index) => {
          if (groups.length > 1) box.append(el("h3", {text: "mask " + (index + 1)}));
          box.append(scoredList(group, (item) => ({label: item.token_str, detail: item.sequence})));
        });
        return box;
      },
    },
    classify: {
      path: "/predict",
      body: (model) => ({inputs: $("classify-text").value, model: model}),
      render: (data) => {
        const labels = firstList(data).slice().sort((a, b) => b.score - a.score);
        return scoredList(labels, (item) => ({label: item.label}));
      },
    },
    ner: {
      path: "/ner",
      body: (model) => ({inputs: $("ner-text").value, model: model}),
      render: (data, body) => {
        const entities = firstList(data);
        const box = el("div", {}, markedText(body.inputs, entities));
        box.append(el("p", {className: "muted", text: entities.length ? entities.length + " entit" +
          (entities.length === 1 ? "y" : "ies") + " found" : "No entities found."}));
        return box;
      },
    },
    qa: {
      path: "/qa",
      body: (model) => ({question: $("qa-question").value, context: $("qa-context").value, model: model}),
      render: (data, body) => {
        const answer = Array.isArray(data) ? data[0] : data;
        if (!answer || !answer.answer) return el("p", {className: "muted", text: "No answer found in the context."});
        return el("div", {},
          el("p", {className: "answer"}, "Answer: ", el("strong", {text: answer.answer}),
            " (score " + fixed(answer.score, 3) + ")"),
          markedText(body.context, [{start: answer.start, end: answer.end, label: "answer", score: answer.score}]));
      },
    },
    search: {
      path: "/search",
      body: () => ({query: $("search-query").value, k: Number($("search-k").value) || 10}),
      render: (data) => {
        const hits = firstList(data);
        if (!hits.length) return el("p", {className: "muted", text: "The index is empty."});
        return scoredList(hits, (hit) => ({label: String(hit.id), detail: hit.text || "",
                                           extra: hit.terms ? matchedTerms(hit.terms) : null}));
      },
    },
  };

  function bindTask(name, panelId) {
    const task = TASKS[name];
    const panel = $(panelId);
    const form = panel.querySelector("form");
    const errorBox = panel.querySelector(".error");
    const output = panel.querySelector(".result");
    let pending = 0;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const model = currentModel();
      const body = task.body(model ? model.name : undefined);
      const request = ++pending;
      panel.setAttribute("aria-busy", "true");
      try {
        const data = await api(task.path, body);
        if (request !== pending) return;
        clearError(errorBox);
        output.replaceChildren(task.render(data, body));
      } catch (err) {
        if (request !== pending) return;
        output.replaceChildren();
        showError(errorBox, err.message);
      } finally {
        if (request === pending) panel.removeAttribute("aria-busy");
      }
    });
  }

  // ----- start -------------------------------------------------------------------------------
  function start() {
    $("model").addEventListener("change", onModelChange);
    $("attention-form").addEventListener("submit", (event) => {
      event.preventDefault();
      runAttention();
    });
    for (const id of ["layer", "head"]) $(id).addEventListener("change", runAttention);
    bindHeatmaps();
    bindTask("fill-mask", "fill-mask-panel");
    bindTask("classify", "classify-panel");
    bindTask("ner", "ner-panel");
    bindTask("qa", "qa-panel");
    bindTask("search", "search-panel");
    $("api-key").value = apiKey();
    $("auth-form").addEventListener("submit", (event) => {
      event.preventDefault();
      try {
        sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
      } catch (err) {
        showError($("global-error"), "This browser does not keep the key (sessionStorage is off): " + err.message);
      }
      loadModels();
    });
    $("api-key-forget").addEventListener("click", () => {
      try {
        sessionStorage.removeItem(KEY_STORAGE);
      } catch (err) {
        // nothing stored
      }
      $("api-key").value = "";
    });
    loadModels();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
