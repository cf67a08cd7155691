// The trio-responses operator page: polls /dashboard/api every second (jobs, finished
// responses, token rates, webhook deliveries), follows one response's events live,
// cancels background responses. No dependencies.
"use strict";

(() => {
  const KEY_NAME = "trio-responses.admin-key";
  const REFRESH_MS = 1000;
  const TERMINAL = new Set(["completed", "failed", "incomplete", "cancelled"]);
  const $ = (selector) => document.querySelector(selector);

  let polling = null;
  let panel = null;

  // -- talking to the server ------------------------------------------------------------

  class SignedOut extends Error {}

  function headers() {
    const key = sessionStorage.getItem(KEY_NAME);
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  async function api(path, options = {}) {
    const response = await fetch(`/dashboard/api/${path}`, {
      ...options,
      headers: { ...headers(), ...(options.headers || {}) },
      cache: "no-store",
    });
    if (response.status === 401) {
      throw new SignedOut(await errorMessage(response));
    }
    return response;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return body.error.message;
    } catch {
      return `The server answered ${response.status}.`;
    }
  }

  async function json(path, options) {
    const response = await api(path, options);
    if (!response.ok) {
      throw new Error(await errorMessage(response));
    }
    return response.json();
  }

  // -- signing in ---------------------------------------------------------------------------

  function showLogin(message) {
    stopPolling();
    $("#board").hidden = true;
    $("#sign-out").hidden = true;
    $("#login").hidden = false;
    $("#login-error").textContent = message || "";
    $("#summary").textContent = "Signed out.";
    closePanel();
    $("#admin-key").focus();
  }

  function signedOut(error) {
    const hadKey = sessionStorage.getItem(KEY_NAME) !== null;
    sessionStorage.removeItem(KEY_NAME);
    showLogin(hadKey ? error.message : "");
  }

  $("#login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("#admin-key");
    sessionStorage.setItem(KEY_NAME, input.value.trim());
    input.value = "";
    start();
  });

  $("#sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_NAME);
    showLogin("");
  });

  // -- the tables and the sparklines ----------------------------------------------------

  function stopPolling() {
    if (polling !== null) {
      clearTimeout(polling);
      polling = null;
    }
  }

  async function start() {
    stopPolling();
    try {
      await refresh();
    } catch (error) {
      if (error instanceof SignedOut) {
        signedOut(error);
        return;
      }
      $("#summary").textContent = `Cannot reach the server: ${error.message}`;
    }
    $("#login").hidden = true;
    $("#board").hidden = false;
    $("#sign-out").hidden = sessionStorage.getItem(KEY_NAME) === null;
    schedule();
  }

  function schedule() {
    polling = setTimeout(async () => {
      try {
        await refresh();
      } catch (error) {
        if (error instanceof SignedOut) {
          signedOut(error);
          return;
        }
        $("#summary").textContent = `Cannot reach the server (retrying): ${error.message}`;
      }
      schedule();
    }, REFRESH_MS);
  }

  async function refresh() {
    const [jobs, recent, rates, webhooks] = await Promise.all([
      json("jobs"),
      json("recent"),
      json("rates"),
      json("webhooks"),
    ]);
    const stats = jobs.statistics;
    $("#summary").textContent =
      `${stats.running} running (${stats.active} generating, ${stats.queued} queued) · ` +
      `${plural(stats.subscribers, "subscriber")} · updated ${new Date().toLocaleTimeString()}`;
    syncRows($("#running tbody"), jobs.data, runningCells);
    $("#running-empty").hidden = jobs.data.length > 0;
    syncRows($("#recent tbody"), recent.data, recentCells);
    $("#recent-empty").hidden = recent.data.length > 0;
    drawRates(rates);
    syncDeliveries($("#webhooks tbody"), webhooks.data);
    $("#webhooks-empty").hidden = webhooks.data.length > 0;
  }

  function kind(item) {
    const parts = [item.background ? "background" : "foreground"];
    if (!item.stored) parts.push("not stored");
    return parts.join(", ");
  }

  function seconds(value) {
    if (value < 60) return `${value.toFixed(0)} s`;
    const minutes = Math.floor(value / 60);
    return `${minutes} min ${(value - minutes * 60).toFixed(0)} s`;
  }

  function runningCells(job) {
    return [
      job.status,
      job.model,
      job.owner || "—",
      kind(job),
      seconds(job.age_s),
      String(job.output_tokens),
      String(job.subscribers),
    ];
  }

  function recentCells(item) {
    const usage = item.usage || {};
    return [
      item.status,
      item.model,
      item.owner || "—",
      kind(item),
      seconds(item.duration_s),
      usage.input_tokens === undefined ? "—" : String(usage.input_tokens),
      String(item.output_tokens),
    ];
  }

  // Rows are kept (and updated in place) by response id, so a focused button survives
  // a refresh.
  function syncRows(tbody, items, cells) {
    const existing = new Map([...tbody.rows].map((row) => [row.dataset.id, row]));
    items.forEach((item, index) => {
      let row = existing.get(item.id);
      existing.delete(item.id);
      if (row === undefined) {
        row = newRow(item.id, cells(item).length);
      }
      const values = cells(item);
      values.forEach((value, i) => {
        const cell = row.cells[i + 1];
        if (cell.textContent !== value) cell.textContent = value;
      });
      row.dataset.status = item.status;
      row.classList.toggle("selected", panel !== null && panel.id === item.id);
      if (tbody.rows[index] !== row) {
        tbody.insertBefore(row, tbody.rows[index] || null);
      }
    });
    for (const row of existing.values()) row.remove();
  }

  // resp_ and 64 hex digits: the start and the end tell them apart at a glance.
  function shortId(id) {
    return id.length > 24 ? `${id.slice(0, 14)}…${id.slice(-6)}` : id;
  }

  const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;

  function newRow(id, count) {
    const row = document.createElement("tr");
    row.dataset.id = id;
    const head = document.createElement("th");
    head.scope = "row";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "open";
    button.textContent = shortId(id);
    button.title = id;
    button.setAttribute("aria-label", `Show the events of ${id}`);
    button.addEventListener("click", () => openPanel(id));
    head.append(button);
    row.append(head);
    for (let i = 0; i < count; i++) row.append(document.createElement("td"));
    return row;
  }

  // -- webhook deliveries -----------------------------------------------------------------

  // A time of day, with its date when it is not today's.
  function clock(unix) {
    const date = new Date(unix * 1000);
    if (date.toDateString() === new Date().toDateString()) return date.toLocaleTimeString();
    return date.toLocaleString();
  }

  function nextAttempt(delivery) {
    if (delivery.status !== "pending" || typeof delivery.next_attempt_at !== "number") return "—";
    const wait = delivery.next_attempt_at - Date.now() / 1000;
    return wait > 0 ? `in ${seconds(wait)}` : "due";
  }

  // The row header (its time) first, then one cell per column; [text, title] shows a
  // short id whose title is the whole one.
  function deliveryCells(delivery) {
    return [
      clock(delivery.created_at),
      delivery.type,
      [shortId(delivery.response_id), delivery.response_id],
      [shortId(delivery.endpoint_id), delivery.endpoint_id],
      delivery.status,
      String(delivery.attempts),
      typeof delivery.status_code === "number" ? String(delivery.status_code) : "—",
      delivery.last_error || "—",
      nextAttempt(delivery),
    ];
  }

  const DELIVERY_CLASSES = [
    "time", "type", "response", "endpoint", "status", "attempts", "code", "last-error", "next",
  ];

  // One row per event and endpoint, kept (and updated in place) by both.
  function syncDeliveries(tbody, deliveries) {
    const existing = new Map([...tbody.rows].map((row) => [row.dataset.key, row]));
    deliveries.forEach((delivery, index) => {
      const key = `${delivery.event_id} ${delivery.endpoint_id}`;
      let row = existing.get(key);
      existing.delete(key);
      if (row === undefined) {
        row = newDeliveryRow(key);
      }
      deliveryCells(delivery).forEach((value, i) => {
        const [text, title] = Array.isArray(value) ? value : [value, ""];
        const cell = row.cells[i];
        if (cell.textContent !== text) cell.textContent = text;
        if (cell.title !== title) cell.title = title;
      });
      for (const status of ["pending", "delivered", "failed"]) {
        row.classList.toggle(status, delivery.status === status);
      }
      if (tbody.rows[index] !== row) {
        tbody.insertBefore(row, tbody.rows[index] || null);
      }
    });
    for (const row of existing.values()) row.remove();
  }

  function newDeliveryRow(key) {
    const row = document.createElement("tr");
    row.dataset.key = key;
    const head = document.createElement("th");
    head.scope = "row";
    row.append(head);
    for (let i = 1; i < DELIVERY_CLASSES.length; i++) row.append(document.createElement("td"));
    DELIVERY_CLASSES.forEach((name, i) => row.cells[i].classList.add(name));
    return row;
  }

  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 240;
  const HEIGHT = 40;

  function drawRates(rates) {
    const list = $("#rates");
    const existing = new Map([...list.children].map((li) => [li.dataset.model, li]));
    for (const series of rates.data) {
      let item = existing.get(series.model);
      existing.delete(series.model);
      if (item === undefined) {
        item = newRateItem(series.model);
        list.append(item);
      }
      const latest = series.tokens_per_s.toFixed(1);
      const average = series.average_tokens_per_s.toFixed(1);
      item.querySelector(".rate").textContent = `${latest} tokens/s`;
      item.querySelector(".average").textContent =
        `average ${average} tokens/s · ${series.output_tokens} tokens since start`;
      const svg = item.querySelector("svg");
      svg.setAttribute(
        "aria-label",
        `Output tokens per second of ${series.model} over the last minute: ` +
          `latest ${latest}, average ${average}`,
      );
      const top = Math.max(1, ...series.points.map((point) => point[1]));
      const coordinates = series.points.map(([ago, rate]) => {
        const x = WIDTH - (ago / rates.window_s) * WIDTH;
        const y = HEIGHT - 2 - (rate / top) * (HEIGHT - 4);
        return `${x.toFixed(1)},${y.toFixed(1)}`;
      });
      svg.querySelector("polyline").setAttribute("points", coordinates.join(" "));
      svg.querySelector("text").textContent = `max ${top.toFixed(0)}`;
    }
    for (const item of existing.values()) item.remove();
  }

  function newRateItem(model) {
    const item = document.createElement("li");
    item.dataset.model = model;
    const name = document.createElement("span");
    name.className = "model";
    name.textContent = model;
    const rate = document.createElement("strong");
    rate.className = "rate";
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
    svg.setAttribute("width", String(WIDTH));
    svg.setAttribute("height", String(HEIGHT));
    svg.setAttribute("role", "img");
    svg.setAttribute("class", "sparkline");
    const base = document.createElementNS(SVG, "line");
    for (const [name, value] of [["x1", 0], ["y1", HEIGHT - 2], ["x2", WIDTH], ["y2", HEIGHT - 2]]) {
      base.setAttribute(name, String(value));
    }
    base.setAttribute("class", "axis");
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("fill", "none");
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", "2");
    label.setAttribute("y", "10");
    svg.append(base, line, label);
    const average = document.createElement("span");
    average.className = "average";
    item.append(name, rate, svg, average);
    return item;
  }

  // -- one response's events --------------------------------------------------------------

  function closePanel() {
    if (panel !== null) {
      panel.controller.abort();
      panel = null;
    }
    $("#panel").hidden = true;
    for (const row of document.querySelectorAll("tr.selected")) row.classList.remove("selected");
  }

  $("#panel-close").addEventListener("click", closePanel);

  function openPanel(id) {
    closePanel();
    panel = {
      id,
      controller: new AbortController(),
      last: -1,
      events: 0,
      done: false,
      status: null,
      background: false,
      items: new Map(),
    };
    $("#panel-id").textContent = id;
    $("#panel-status").textContent = "…";
    $("#panel-events").textContent = "0";
    $("#panel-message").textContent = "";
    $("#panel-items").replaceChildren();
    $("#panel-cancel").disabled = true;
    $("#panel").hidden = false;
    for (const row of document.querySelectorAll(`tr[data-id="${CSS.escape(id)}"]`)) {
      row.classList.add("selected");
    }
    follow(panel);
  }

  function setStatus(current, response) {
    current.status = response.status;
    current.background = Boolean(response.background);
    if (current !== panel) return;
    $("#panel-status").textContent = response.status;
    $("#panel-cancel").disabled = !current.background || TERMINAL.has(response.status);
  }

  function connection(current, text) {
    if (current === panel) $("#panel-connection").textContent = text;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // EventSource cannot send an Authorization header: read the SSE body with fetch, and
  // resume after the last event seen when the connection drops.
  async function follow(current) {
    let backoff = 250;
    while (current === panel && !current.done) {
      try {
        const query = current.last >= 0 ? `?starting_after=${current.last}` : "";
        const response = await api(
          `responses/${encodeURIComponent(current.id)}/events${query}`,
          { signal: current.controller.signal },
        );
        if (!response.ok) {
          const message = await errorMessage(response);
          connection(current, "not streaming");
          if (current === panel) $("#panel-message").textContent = message;
          await showStored(current);
          return;
        }
        connection(current, "live");
        backoff = 250;
        await readEvents(current, response.body);
      } catch (error) {
        if (current.controller.signal.aborted) return;
        if (error instanceof SignedOut) {
          signedOut(error);
          return;
        }
      }
      if (current.done || current !== panel) break;
      connection(current, "reconnecting");
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 5000);
    }
    connection(current, "ended");
  }

  async function readEvents(current, body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replaceAll("\r\n", "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        handleFrame(current, frame);
      }
    }
  }

  function handleFrame(current, frame) {
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length === 0) return; // a comment (keep-alive)
    const text = data.join("\n");
    if (text === "[DONE]") {
      current.done = true;
      return;
    }
    const event = JSON.parse(text);
    if (event.type === "error") {
      if (current === panel) $("#panel-message").textContent = event.message || event.code;
      return;
    }
    if (event.sequence_number <= current.last) return; // replayed after a resume
    current.last = event.sequence_number;
    current.events += 1;
    if (current !== panel) return;
    $("#panel-events").textContent = String(current.events);
    applyEvent(current, event);
  }

  function applyEvent(current, event) {
    if (event.response) setStatus(current, event.response);
    if (event.type === "response.output_item.added") {
      itemBlock(current, event.item.id, event.item);
    } else if (event.type === "response.output_item.done") {
      itemBlock(current, event.item.id, event.item);
      showProducts(current, event.item);
    } else if (event.type.endsWith(".delta") && typeof event.delta === "string") {
      const pre = itemBlock(current, event.item_id, null);
      pre.append(document.createTextNode(event.delta));
      pre.scrollTop = pre.scrollHeight;
    }
  }

  function itemTitle(item) {
    if (item === null) return "output";
    if (item.name) return `${item.type}: ${item.name}`;
    return item.type;
  }

  function itemBlock(current, id, item) {
    let pre = current.items.get(id);
    if (pre === undefined) {
      const block = document.createElement("section");
      block.className = `item item-${item ? item.type : "output"}`;
      const title = document.createElement("h3");
      title.textContent = itemTitle(item);
      pre = document.createElement("pre");
      pre.tabIndex = 0;
      pre.setAttribute("aria-label", `${itemTitle(item)} text`);
      block.append(title, pre);
      $("#panel-items").append(block);
      current.items.set(id, pre);
    }
    return pre;
  }

  // Images are shown from data: URLs only (the page's CSP allows no other source).
  const IMAGE_URL = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]*$/;

  // What a finished item produced besides its text: a code interpreter call's logs and
  // images, the container files an answer cites. Replaced as a whole when shown again.
  function showProducts(current, item) {
    const pre = current.items.get(item.id);
    if (pre === undefined) return;
    const block = pre.parentElement;
    const extras = document.createElement("div");
    extras.className = "products";
    if (item.type === "code_interpreter_call") {
      const outputs = Array.isArray(item.outputs) ? item.outputs : [];
      const logs = outputs
        .filter((output) => output && output.type === "logs" && typeof output.logs === "string")
        .map((output) => output.logs)
        .join("");
      if (logs) {
        const label = document.createElement("h4");
        label.textContent = "logs";
        const text = document.createElement("pre");
        text.className = "logs";
        text.tabIndex = 0;
        text.setAttribute("aria-label", "code_interpreter_call logs");
        text.textContent = logs;
        extras.append(label, text);
      }
      let count = 0;
      for (const output of outputs) {
        if (!output || output.type !== "image") continue;
        if (typeof output.url !== "string" || !IMAGE_URL.test(output.url)) continue;
        count += 1;
        const image = document.createElement("img");
        image.className = "output-image";
        image.alt = `Image ${count} the code produced`;
        image.src = output.url;
        extras.append(image);
      }
    } else if (item.type === "message") {
      const names = [];
      for (const part of Array.isArray(item.content) ? item.content : []) {
        const notes = part && Array.isArray(part.annotations) ? part.annotations : [];
        for (const note of notes) {
          if (!note || note.type !== "container_file_citation") continue;
          if (typeof note.filename !== "string") continue;
          if (!names.includes(note.filename)) names.push(note.filename);
        }
      }
      if (names.length > 0) {
        const label = document.createElement("p");
        label.className = "cited-label";
        label.textContent = "Cited files:";
        const list = document.createElement("ul");
        list.className = "cited-files";
        for (const name of names) {
          const entry = document.createElement("li");
          entry.textContent = name;
          list.append(entry);
        }
        extras.append(label, list);
      }
    }
    const old = block.querySelector(":scope > .products");
    if (extras.childElementCount === 0) {
      if (old) old.remove();
    } else if (old) {
      old.replaceWith(extras);
    } else {
      block.append(extras);
    }
  }

  // A response whose events cannot be followed: show it as it stands.
  async function showStored(current) {
    try {
      const response = await json(`responses/${encodeURIComponent(current.id)}`);
      if (current !== panel) return;
      setStatus(current, response);
      for (const item of response.output || []) {
        const pre = itemBlock(current, item.id, item);
        const parts = item.content || item.summary || [];
        const text = parts.map((part) => part.text || "").join("");
        pre.textContent = text || item.arguments || item.code || "";
        showProducts(current, item);
      }
    } catch (error) {
      if (error instanceof SignedOut) signedOut(error);
    }
  }

  $("#panel-cancel").addEventListener("click", async () => {
    const current = panel;
    if (current === null) return;
    $("#panel-cancel").disabled = true;
    $("#panel-message").textContent = "Cancelling…";
    try {
      const response = await json(`responses/${encodeURIComponent(current.id)}/cancel`, {
        method: "POST",
      });
      if (current !== panel) return;
      setStatus(current, response);
      $("#panel-message").textContent = `Response ${response.status}.`;
    } catch (error) {
      if (error instanceof SignedOut) {
        signedOut(error);
        return;
      }
      if (current !== panel) return;
      $("#panel-message").textContent = error.message;
      $("#panel-cancel").disabled = TERMINAL.has(current.status) || !current.background;
    }
  });

  start();
})();
