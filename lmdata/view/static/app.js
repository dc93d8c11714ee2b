// lmdata view: fetches JSON from this server and renders it with DOM text nodes only
// (textContent, never innerHTML), so documents containing markup are shown, not run.
"use strict";

const state = { start: 0, count: 10, records: 0, info: null };
const $ = (id) => document.getElementById(id);
// the per-run token of the URL lmdata view printed, sent with every API request (a cookie
// set with the page also carries it, for a reload of the page without it)
const TOKEN = new URLSearchParams(location.search).get("token");

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

function fmt(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : String(n);
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store", headers: TOKEN ? { "X-Lmdata-Token": TOKEN } : {} });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function histogram(d) {
  const NS = "http://www.w3.org/2000/svg";
  const h = d.histogram, counts = h.counts, edges = h.edges;
  const W = 520, H = 150, L = 40, B = 28;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("id", "length-histogram");
  const peak = Math.max(1, ...counts);
  const bw = (W - L) / Math.max(1, counts.length);
  counts.forEach((c, i) => {
    const r = document.createElementNS(NS, "rect");
    const bh = (H - B - 8) * c / peak;
    r.setAttribute("class", "bar");
    r.setAttribute("x", L + i * bw);
    r.setAttribute("y", H - B - bh);
    r.setAttribute("width", Math.max(1, bw - 1));
    r.setAttribute("height", bh);
    const t = document.createElementNS(NS, "title");
    t.textContent = `${fmt(Math.round(edges[i]))} - ${fmt(Math.round(edges[i + 1]))} ${d.unit}: ${fmt(c)} records`;
    r.append(t);
    svg.append(r);
  });
  const label = (x, y, s, anchor) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", x);
    t.setAttribute("y", y);
    t.setAttribute("text-anchor", anchor);
    t.textContent = s;
    svg.append(t);
  };
  label(L, H - 10, fmt(Math.round(edges[0] ?? 0)), "start");
  label(W, H - 10, fmt(Math.round(edges[edges.length - 1] ?? 0)), "end");
  label((L + W) / 2, H - 10, `${d.unit} per record${h.scale === "log" ? " (log bins)" : ""}`, "middle");
  label(0, 12, fmt(peak), "start");
  return svg;
}

function renderInfo(info) {
  state.info = info;
  state.records = info.records;
  $("title").textContent = info.path;
  document.title = `lmdata view: ${info.path}`;
  const kind = info.kind === "tokens" ? "token sequences" : "records";
  $("subtitle").textContent = `${info.format}, ${kind}` + (info.split ? `, split ${info.split}` : "")
    + (info.tokenizer ? `, decoded with ${info.tokenizer}` : info.kind === "tokens"
      ? " (ids only: run with --tokenizer FILE to see text)" : "")
    + (info.tokenizer_note ? ` (${info.tokenizer_note})` : "");
  const rows = [["records", info.records]];
  const i = info.info || {};
  for (const k of ["tokens", "max_token_id", "documents", "samples", "examples", "files", "shards", "bytes_on_disk"]) {
    if (typeof i[k] === "number") rows.push([k.replace(/_/g, " "), i[k]]);
  }
  const d = info.lengths;
  if (d && d.count) {
    rows.push([`median length (${d.unit})`, Math.round(d.median)]);
    rows.push([`max length (${d.unit})`, d.max]);
  }
  const table = el("table", { id: "summary-table" });
  for (const [k, v] of rows) table.append(el("tr", {}, el("td", { text: k }), el("td", { text: fmt(v) })));
  const raw = el("details", {}, el("summary", { text: "lmdata info" }),
    el("pre", { text: JSON.stringify(info.info, null, 2) }));
  $("summary").replaceChildren(table, raw);
  if (d && d.count) {
    const note = info.sample && info.sample.sampled && info.sample.what === "records"
      ? el("p", { class: "note", text: `length histogram of ${fmt(d.count)} sampled records` }) : null;
    const parts = [el("div", { text: `Length of records (${d.unit})` }), histogram(d)];
    if (note) parts.push(note);
    $("histogram").replaceChildren(...parts);
  }
  if (info.kind === "tokens") $("find").hidden = true;
  if (!info.tokenizer) $("bounds-label").hidden = true;
}

function tokensView(t) {
  if (t.pieces) {
    const box = el("div", { class: "text tokens" + ($("bounds").checked ? " bounds" : "") });
    for (const [ids, piece] of t.pieces) {
      const span = el("span", { class: "tok" + (piece === "" ? " empty" : ""), title: `id ${ids.join(", ")}` });
      span.textContent = piece;
      box.append(span);
    }
    return box;
  }
  return el("pre", { class: "text ids", text: t.ids.join(" ") });
}

function recordView(item) {
  const art = el("article", { class: "record", "data-index": String(item.index), id: `r${item.index}` });
  let head = `#${fmt(item.index)}`;
  const parts = [];
  if (item.kind === "tokens") {
    head += ` \u00b7 ${fmt(item.tokens.length)} tokens`;
    parts.push(tokensView(item.tokens));
    if (item.tokens.shown < item.tokens.length) {
      parts.push(el("p", { class: "note", text: `first ${fmt(item.tokens.shown)} tokens shown` }));
    }
    if (item.tokens.error) parts.push(el("p", { class: "note", text: item.tokens.error }));
  } else {
    if (typeof item.text === "string") {
      head += ` \u00b7 ${fmt(item.chars)} characters`;
      parts.push(el("pre", { class: "text doc", text: item.text }));
    }
    for (const [name, t] of Object.entries(item.token_fields || {})) {
      parts.push(el("div", { class: "note", text: `${name}: ${fmt(t.length)} tokens` }), tokensView(t));
    }
    const fields = el("details", { class: "fields" }, el("summary", { text: "fields" }),
      el("pre", { text: JSON.stringify(item.fields, null, 2) }));
    if (typeof item.text !== "string" && !item.token_fields) fields.open = true;
    parts.push(fields);
  }
  art.append(el("h2", { text: head }), ...parts);
  return art;
}

async function load(start, focus) {
  $("status").textContent = "";
  try {
    const page = await getJSON(`/api/records?start=${start}&count=${state.count}`);
    state.start = page.start;
    state.records = page.records;
    const last = page.start + page.items.length - 1;
    $("range").textContent = page.items.length
      ? `records ${fmt(page.start)}\u2013${fmt(last)} of ${fmt(page.records)}` : "no records";
    $("records").replaceChildren(...page.items.map(recordView));
    $("prev").disabled = page.start <= 0;
    $("next").disabled = last >= page.records - 1;
    history.replaceState(null, "", `#i=${page.start}&n=${state.count}`);
    if (focus != null) {
      const node = $(`r${focus}`);
      if (node) { node.classList.add("current"); node.scrollIntoView({ block: "nearest" }); }
    }
  } catch (e) {
    $("status").textContent = e.message;
  }
}

function fromHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const n = parseInt(p.get("n"), 10);
  if (n > 0) { state.count = Math.min(n, 100); $("size").value = String(state.count); }
  return Math.max(0, parseInt(p.get("i"), 10) || 0);
}

async function main() {
  const start = fromHash();
  try {
    renderInfo(await getJSON("/api/info"));
  } catch (e) {
    $("status").textContent = e.message;
    return;
  }
  $("prev").addEventListener("click", () => load(Math.max(0, state.start - state.count)));
  $("next").addEventListener("click", () => load(state.start + state.count));
  $("size").addEventListener("change", () => { state.count = parseInt($("size").value, 10); load(state.start); });
  $("bounds").addEventListener("change", () => {
    for (const b of document.querySelectorAll(".tokens")) b.classList.toggle("bounds", $("bounds").checked);
  });
  $("jump").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const i = parseInt($("jump-index").value, 10);
    if (!(i >= 0 && i < state.records)) {
      $("status").textContent = `index must be between 0 and ${fmt(state.records - 1)}`;
      return;
    }
    load(i, i);
  });
  $("find").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("status").textContent = "searching\u2026";
    try {
      const r = await getJSON(`/api/find?id=${encodeURIComponent($("find-id").value)}`);
      if (r.found) load(r.index, r.index);
      else $("status").textContent = r.message;
    } catch (e) {
      $("status").textContent = e.message;
    }
  });
  await load(start);
  document.body.dataset.ready = "1";
}

main();
