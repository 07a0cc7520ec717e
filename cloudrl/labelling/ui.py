"""The page: HTML shells, one stylesheet and two small scripts, served from memory.

No build step and no third-party script: the charts are SVG drawn by ``label.js``
from the segment views. Every panel of a pair shares its y axis between the two sides
so heights compare at a glance. Policy names are not shown (the comparison is blind).
Keyboard: Left = A better, Right = B better, Down or ``=`` = equally good, ``s`` = can't
tell (skip); keys are ignored while the note field has focus.

Nothing is styled inline (the Content-Security-Policy allows no inline style): the
legend swatches take classes of the stylesheet, made from the palettes below (one
source for the stylesheet and the script); the charts colour SVG ``fill``/``stroke``
attributes; the space the fixed choice bar needs under the page is a CSS variable the
script sets through the CSSOM as the bar changes height.
"""

from __future__ import annotations

import hashlib
import json

# no colour repeats within a palette: every power state has its own, far apart to the eye
LINE_COLORS = ("#0b5cad", "#c2410c", "#15803d", "#7e22ce", "#a16207", "#0e7490", "#be185d")
SLA_COLORS = ("#b91c1c", "#7e22ce", "#c2410c", "#0e7490")
STATE_COLORS = {"active": "#15803d", "idle": "#84cc16", "waking": "#f59e0b",
                "booting": "#c2410c", "asleep": "#38bdf8", "suspended": "#7c3aed",
                "off": "#374151"}


def swatch_css() -> str:
    """One class per palette entry: ``.sw.line-I``, ``.sw.sla-I``, ``.sw.state-NAME``."""
    rules = [f".sw.line-{i} {{ background:{c}; }}" for i, c in enumerate(LINE_COLORS)]
    rules += [f".sw.sla-{i} {{ background:{c}; }}" for i, c in enumerate(SLA_COLORS)]
    rules += [f".sw.state-{k} {{ background:{c}; }}" for k, c in STATE_COLORS.items()]
    return "\n".join(rules) + "\n"


CSS = r"""
:root { --fg:#1b1f24; --muted:#4a5563; --bg:#f6f7f9; --card:#fff; --line:#d0d5dc;
  --accent:#0b5cad; --accent-fg:#fff; --focus:#c2410c; --ok:#166534; --bad:#b91c1c; }
* { box-sizing: border-box; }
html { overflow-y: scroll; }
body { margin:0; font:15px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color:var(--fg); background:var(--bg); }
header.top { display:flex; align-items:center; gap:1rem; padding:.5rem 1rem;
  background:#14202e; color:#fff; }
header.top h1 { font-size:1.05rem; margin:0; font-weight:600; }
header.top .who { margin-left:auto; font-size:.9rem; }
header.top a, header.top button.link { color:#fff; }
button.link { background:none; border:0; text-decoration:underline; cursor:pointer;
  font:inherit; padding:0; }
main { padding: .75rem 1rem calc(var(--bar-h, 5.5rem) + .75rem); max-width: 1500px;
  margin: 0 auto; }
:focus-visible { outline:3px solid var(--focus); outline-offset:2px; }
.login { max-width: 26rem; margin: 4rem auto; background:var(--card); padding:1.5rem;
  border:1px solid var(--line); border-radius:8px; }
.login label { display:block; font-weight:600; margin-bottom:.35rem; }
.login input { width:100%; padding:.5rem; font:inherit; border:1px solid #8a94a3;
  border-radius:4px; }
.login button { margin-top:.75rem; }
.pair { display:grid; grid-template-columns: 1fr 1fr; gap: .9rem; }
@media (max-width: 900px) { .pair { grid-template-columns: 1fr; } }
.side { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:.6rem .8rem; min-width:0; }
.side h2 { margin:0; font-size:1.05rem; display:flex; align-items:baseline; gap:.5rem; }
.side h2 .key { font-size:.8rem; color:var(--muted); font-weight:500; }
.side .meta { color:var(--muted); font-size:.85rem; margin:.1rem 0 .4rem; }
dl.summary { display:grid; grid-template-columns: 1fr auto 1fr auto; column-gap:.8rem;
  font-size:.88rem; margin:0 0 .3rem; }
@media (max-width: 1100px) { dl.summary { grid-template-columns: 1fr auto; } }
dl.summary dt { color:var(--muted); padding:.1rem 0; border-top:1px solid #eef0f3; }
dl.summary dd { margin:0; text-align:right; font-variant-numeric: tabular-nums;
  font-weight:600; padding:.1rem 0; border-top:1px solid #eef0f3; }
.panel { margin-top:.35rem; }
.panel h3 { font-size:.85rem; margin:0; font-weight:600; display:flex; gap:.6rem;
  flex-wrap:wrap; align-items:center; }
.panel h3 .unit { color:var(--muted); font-weight:400; }
.legend { display:inline-flex; gap:.5rem; flex-wrap:wrap; font-weight:400; font-size:.78rem; }
.legend .sw { display:inline-block; width:.7rem; height:.7rem; border-radius:2px;
  margin-right:.2rem; vertical-align:-1px; }
svg.chart { width:100%; height:auto; display:block; }
svg.chart text { font-size:11px; fill:#4a5563; }
.choices { position:fixed; left:0; right:0; bottom:0; background:#fff;
  border-top:1px solid var(--line); padding:.55rem 1rem; box-shadow:0 -2px 8px #0001; }
.choices .row { max-width:1500px; margin:0 auto; display:flex; gap:.6rem; flex-wrap:wrap;
  align-items:center; }
.choices button { font:inherit; font-weight:600; padding:.55rem .9rem; border-radius:6px;
  border:1px solid #5b6675; background:#fff; color:var(--fg); cursor:pointer; }
.choices button.primary { background:var(--accent); border-color:var(--accent);
  color:var(--accent-fg); }
.choices button:hover { filter:brightness(.95); }
.choices button.pressed { outline:3px solid var(--focus); }
.choices button kbd { font:inherit; font-size:.78rem; font-weight:500; opacity:.85;
  margin-left:.35rem; }
.choices label { font-size:.85rem; color:var(--muted); }
.choices textarea { flex:1 1 16rem; min-width:12rem; height:2.4rem; font:inherit;
  font-size:.9rem; padding:.35rem; border:1px solid #8a94a3; border-radius:4px;
  resize:vertical; }
.status { min-height:1.3rem; font-size:.9rem; color:var(--muted); margin:.25rem 0 .5rem; }
.choices .status { margin:0; flex:0 1 16rem; }
.status.error { color:var(--bad); font-weight:600; }
.empty { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:2rem; text-align:center; }
.admin table { border-collapse:collapse; background:#fff; margin:.5rem 0 1.2rem;
  font-size:.9rem; }
.admin th, .admin td { border:1px solid var(--line); padding:.3rem .55rem; text-align:left; }
.admin td.num { text-align:right; font-variant-numeric: tabular-nums; }
.admin .flag { color:var(--bad); font-weight:700; }
.big { font-size:1.4rem; font-weight:700; }
.cards { display:flex; gap:1rem; flex-wrap:wrap; }
.cards > div { background:#fff; border:1px solid var(--line); border-radius:8px;
  padding:.6rem .9rem; min-width:10rem; }
.sr-only { position:absolute; width:1px; height:1px; overflow:hidden; clip:rect(0 0 0 0); }
""" + swatch_css()

COMMON_JS = r"""
"use strict";
const TOKEN_KEY = "cloudrl-label-token";
function token() { return sessionStorage.getItem(TOKEN_KEY); }
async function api(path, opts) {
  opts = opts || {};
  const headers = {"Authorization": "Bearer " + token()};
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {method: opts.method || "GET", headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body)});
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (!r.ok) {
    const err = new Error((data && data.detail) || ("HTTP " + r.status));
    err.status = r.status; throw err;
  }
  return data;
}
function el(tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") n.className = v; else if (k === "text") n.textContent = v;
    else n.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined)
    n.append(typeof k === "string" ? document.createTextNode(k) : k);
  return n;
}
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const d = digits === undefined ? (Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) : digits;
  return Number(v).toLocaleString("en-US", {maximumFractionDigits: d, minimumFractionDigits: 0});
}
function setupLogin(onReady) {
  const main = document.querySelector("main");
  async function check() {
    try { const me = await api("/api/me"); onReady(me); return true; }
    catch (e) { sessionStorage.removeItem(TOKEN_KEY); return e; }
  }
  function showForm(message) {
    main.replaceChildren();
    const input = el("input", {id: "token", type: "password", autocomplete: "off",
      "aria-describedby": "login-msg", required: ""});
    const msg = el("p", {id: "login-msg", role: "alert", class: "status" +
      (message ? " error" : "")}, message || "Paste the token you got from your admin.");
    const form = el("form", {class: "login", id: "login"},
      el("label", {for: "token"}, "Operator token"), input, msg,
      el("button", {type: "submit", class: "primary", id: "sign-in"}, "Sign in"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      const ok = await check();
      if (ok !== true) showForm(ok.status === 401 ? "That token is not valid." : ok.message);
    });
    main.append(form); input.focus();
  }
  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY); location.reload();
  });
  if (token()) check().then((ok) => { if (ok !== true) showForm(); }); else showForm();
}
"""

LABEL_JS = f"""
const COLORS = {json.dumps(list(LINE_COLORS))};
const SLA_COLORS = {json.dumps(list(SLA_COLORS))};
const STATE_COLORS = {json.dumps(STATE_COLORS)};
const STATE_ORDER = {json.dumps(list(STATE_COLORS))};
""" + r"""
const PANELS = [
  {id: "grid", title: "Grid draw", unit: "kW", kind: "line",
   match: (k) => k === "grid_kw" || k === "solar_kw"},
  {id: "price", title: "Electricity price", unit: "$/MWh", kind: "line",
   match: (k) => k === "price"},
  {id: "carbon", title: "Grid carbon", unit: "gCO2/kWh", kind: "line",
   match: (k) => k === "carbon"},
  {id: "queue", title: "Jobs waiting", unit: "jobs", kind: "line", group: "queue"},
  {id: "sla", title: "SLA violations", unit: "per tick", kind: "bars", group: "sla"},
  {id: "servers", title: "Servers by power state", unit: "servers", kind: "stack",
   match: (k) => k.startsWith("servers:")},
];
const SUMMARY = [
  ["cost_usd", "Cost, all terms", "$"], ["energy_kwh", "Energy", "kWh"],
  ["energy_cost", "Energy cost", "$"],
  ["sla_violations", "SLA violations", ""], ["mean_queue", "Jobs waiting, mean", ""],
  ["max_queue", "Jobs waiting, max", ""], ["mean_active_servers", "Active servers, mean", ""],
  ["mean_price", "Price, mean", "$/MWh"], ["mean_carbon", "Carbon, mean", "gCO2/kWh"],
];
const NAMES = {grid_kw: "grid", solar_kw: "solar", queue: "all", sla: "all"};

function panelKeys(panel, series) {
  const keys = Object.keys(series);
  if (panel.group) {
    const per = keys.filter((k) => k.startsWith(panel.group + ":")).sort();
    return per.length ? per : keys.filter((k) => k === panel.group);
  }
  let ks = keys.filter(panel.match);
  if (panel.kind === "stack") ks.sort((a, b) => STATE_ORDER.indexOf(a.slice(8)) -
    STATE_ORDER.indexOf(b.slice(8)));
  return ks;
}
function label(k) { return NAMES[k] || (k.includes(":") ? k.split(":")[1] : k); }
function swatch(panel, k, i) {
  // [colour, class of the stylesheet]: the same palette entry
  const st = k.slice(8);
  if (panel.kind === "stack" && STATE_COLORS[st]) return [STATE_COLORS[st], "state-" + st];
  if (panel.id === "sla") return [SLA_COLORS[i % SLA_COLORS.length],
                                  "sla-" + (i % SLA_COLORS.length)];
  return [COLORS[i % COLORS.length], "line-" + (i % COLORS.length)];
}
function color(panel, k, i) { return swatch(panel, k, i)[0]; }
function niceMax(hi) {
  if (!(hi > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(hi)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * e >= hi * 0.999) return m * e;
  return 10 * e;
}
function yRange(panel, keys, views) {
  let lo = 0, hi = 0;
  for (const v of views) {
    const s = v.series, n = v.length;
    for (let t = 0; t < n; t++) {
      if (panel.kind === "stack") {
        let sum = 0; for (const k of keys) sum += (s[k] && s[k][t]) || 0;
        hi = Math.max(hi, sum);
      } else for (const k of keys) {
        const x = s[k] ? s[k][t] : null;
        if (x !== null && x !== undefined) { hi = Math.max(hi, x); lo = Math.min(lo, x); }
      }
    }
  }
  return [lo < 0 ? -niceMax(-lo) : 0, niceMax(hi), hi > 0 || lo < 0];
}
const NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  return n;
}
function chart(panel, keys, view, range, ariaLabel, width) {
  const W = Math.max(240, Math.round(width || 420)), H = 78, L = 40, R = 6, T = 6, B = 15;
  const s = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
                        "aria-label": ariaLabel});
  const n = view.length, [lo, hi, any] = range;
  const x = (t) => L + (n <= 1 ? 0 : (t / (n - 1)) * (W - L - R));
  const xb = (t) => L + (t / n) * (W - L - R);
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  if (!any) {
    const msg = svg("text", {x: (L + W - R) / 2, y: T + (H - T - B) * 0.3,
                             "text-anchor": "middle"});
    msg.textContent = "none in either segment"; s.append(msg);
  }
  for (const v of (lo < 0 ? [lo, 0, hi] : [lo, (lo + hi) / 2, hi])) {
    s.append(svg("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e5e7eb"}));
    const tx = svg("text", {x: L - 4, y: y(v) + 3, "text-anchor": "end"});
    tx.textContent = fmt(v); s.append(tx);
  }
  const t0 = svg("text", {x: L, y: H - 3}); t0.textContent = "tick " + view.start;
  const t1 = svg("text", {x: W - R, y: H - 3, "text-anchor": "end"});
  t1.textContent = "" + (view.start + n - 1);
  s.append(t0, t1);
  if (panel.kind === "stack") {
    const base = new Array(n).fill(0);
    keys.forEach((k, i) => {
      const vals = view.series[k] || [];
      const top = base.map((b, t) => b + (vals[t] || 0));
      const pts = [];
      for (let t = 0; t < n; t++) {
        pts.push(`${xb(t)},${y(top[t])}`, `${xb(t + 1)},${y(top[t])}`);
      }
      for (let t = n - 1; t >= 0; t--) {
        pts.push(`${xb(t + 1)},${y(base[t])}`, `${xb(t)},${y(base[t])}`);
      }
      s.append(svg("polygon", {points: pts.join(" "), fill: color(panel, k, i), opacity: 0.85}));
      for (let t = 0; t < n; t++) base[t] = top[t];
    });
  } else if (panel.kind === "bars") {
    const bw = (W - L - R) / n / Math.max(1, keys.length);
    keys.forEach((k, i) => {
      (view.series[k] || []).forEach((v, t) => {
        if (v) s.append(svg("rect", {x: xb(t) + i * bw, y: y(v), width: Math.max(1, bw - 0.5),
          height: Math.max(0.5, y(lo) - y(v)), fill: color(panel, k, i)}));
      });
    });
  } else {
    keys.forEach((k, i) => {
      let pts = [];
      const flush = () => { if (pts.length) s.append(svg("polyline", {points: pts.join(" "),
        fill: "none", stroke: color(panel, k, i), "stroke-width": 2,
        "stroke-linejoin": "round"})); pts = []; };
      (view.series[k] || []).forEach((v, t) => {
        if (v === null || v === undefined) flush(); else pts.push(`${x(t)},${y(v)}`);
      });
      flush();
    });
  }
  return s;
}
function describe(view) {
  const mins = (view.length * view.tick_seconds) / 60;
  const span = mins >= 120 ? `${fmt(mins / 60, 1)} h` : `${fmt(mins, 0)} min`;
  return `${view.scenario || "workload"} · seed ${view.seed >= 0 ? view.seed : "–"} · ` +
    `ticks ${view.start}–${view.start + view.length - 1} (${span})`;
}
function side(name, keyHint, view, other) {
  const box = el("section", {class: "side", "aria-label": "Segment " + name});
  box.append(el("h2", {}, "Segment " + name, el("span", {class: "key"}, keyHint)),
             el("div", {class: "meta"}, describe(view)));
  const rows = SUMMARY.filter(([k]) => (view.summary[k] ?? other.summary[k]) !== undefined &&
    ((view.summary[k] ?? null) !== null || (other.summary[k] ?? null) !== null));
  const extra = Object.keys(view.summary).filter((k) => k.startsWith("sla_violations:")).sort()
    .map((k) => [k, "SLA violations, " + k.split(":")[1], ""]);
  const table = el("dl", {class: "summary"});
  const cores = (view.units || {}).queue === "cores";
  for (let [k, title, unit] of rows.concat(extra)) {
    if (cores && (k === "mean_queue" || k === "max_queue")) {
      title = title.replace("Jobs waiting", "Work waiting"); unit = "cores";
    }
    table.append(el("dt", {}, title + (unit ? ` (${unit})` : "")),
                 el("dd", {"data-key": k}, fmt(view.summary[k])));
  }
  box.append(table);
  return box;
}
function renderPair(main, task) {
  const a = side("A", "← Left arrow", task.left, task.right);
  const b = side("B", "Right arrow →", task.right, task.left);
  main.replaceChildren(el("div", {class: "pair", id: "pair"}, a, b));
  const width = a.clientWidth - 26;
  state.width = width;
  for (const panel of PANELS) {
    const keys = Array.from(new Set(panelKeys(panel, task.left.series)
      .concat(panelKeys(panel, task.right.series))));
    if (!keys.length) continue;
    const range = yRange(panel, keys, [task.left, task.right]);
    const legend = keys.length > 1 ? el("span", {class: "legend"}, ...keys.map((k, i) =>
      el("span", {}, el("i", {class: "sw " + swatch(panel, k, i)[1], "aria-hidden": "true"}),
         label(k)))) : null;
    for (const [box, view, nm] of [[a, task.left, "A"], [b, task.right, "B"]]) {
      const cores = panel.id === "queue" && (view.units || {}).queue === "cores";
      const div = el("div", {class: "panel", "data-panel": panel.id},
        el("h3", {}, cores ? "Work waiting" : panel.title,
           el("span", {class: "unit"}, cores ? "cores" : panel.unit),
           legend ? legend.cloneNode(true) : null),
        chart(panel, keys, view, range, `${panel.title} of segment ${nm}`, width));
      box.append(div);
    }
  }
}
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    const box = document.querySelector("#pair .side");
    if (state.task && box && Math.abs(box.clientWidth - 26 - state.width) > 8) {
      renderPair(document.getElementById("work"), state.task);
    }
  }, 150);
});

const state = {task: null, shownAt: 0, busy: false, count: 0, width: 0};
const CHOICES = [["a", "A better", "←"], ["equal", "Equally good", "↓ or ="],
                 ["b", "B better", "→"], ["skip", "Can't tell", "s"]];

function setStatus(text, error) {
  const s = document.getElementById("status");
  if (error) document.getElementById("choices").hidden = false;
  s.textContent = text; s.className = "status" + (error ? " error" : "");
  s.setAttribute("role", error ? "alert" : "status");
}
function show(task) {
  state.task = task;
  const main = document.getElementById("work");
  const bar = document.getElementById("choices");
  if (!task) {
    bar.hidden = true;
    const again = el("button", {type: "button", id: "again", class: "primary"}, "Check again");
    again.addEventListener("click", load);
    main.replaceChildren(el("div", {class: "empty", id: "empty"},
      el("p", {class: "big"}, "No pairs are waiting for you."),
      el("p", {}, "Thank you. New pairs appear when the admin enqueues them."), again));
    return;
  }
  bar.hidden = false;
  renderPair(main, task);
  document.getElementById("note").value = "";
  state.shownAt = performance.now();
}
async function load() {
  try { const r = await api("/api/next"); show(r.task); setStatus(""); }
  catch (e) { setStatus(e.message, true); }
}
async function choose(choice) {
  if (!state.task || state.busy) return;
  state.busy = true;
  const btn = document.querySelector(`button[data-choice="${choice}"]`);
  if (btn) btn.classList.add("pressed");
  const note = document.getElementById("note").value.trim();
  try {
    const r = await api("/api/labels", {method: "POST", body: {
      assignment_id: state.task.assignment_id, choice, note: note || null,
      time_taken_ms: Math.round(performance.now() - state.shownAt)}});
    state.count += 1;
    document.getElementById("count").textContent = state.count;
    const said = {a: "A better", b: "B better", equal: "equally good", skip: "skipped"}[choice];
    setStatus(`Saved: ${said}. Next pair loaded.`);
    show(r.task);
  } catch (e) {
    setStatus("Not saved: " + e.message, true);
    if (e.status === 404 || e.status === 409) load();
  } finally {
    state.busy = false;
    if (btn) setTimeout(() => btn.classList.remove("pressed"), 150);
  }
}
function padForBar() {
  // the page ends above the fixed bar, whatever its height (it wraps on narrow windows)
  const bar = document.getElementById("choices");
  const fit = () => document.documentElement.style.setProperty("--bar-h",
    (bar.hidden ? 0 : bar.getBoundingClientRect().height) + "px");
  new ResizeObserver(fit).observe(bar);
  new MutationObserver(fit).observe(bar, {attributes: true, attributeFilter: ["hidden"]});
  fit();
}
function buildBar() {
  const row = document.querySelector("#choices .row");
  for (const [c, text, key] of CHOICES) {
    const b = el("button", {type: "button", "data-choice": c, id: "choose-" + c,
      class: c === "skip" ? "" : "primary", "aria-keyshortcuts": key}, text,
      el("kbd", {}, key));
    b.addEventListener("click", () => choose(c));
    row.append(b);
  }
  row.append(el("label", {for: "note"}, "Note (optional)"),
             el("textarea", {id: "note", maxlength: "2000",
                             placeholder: "What made the difference?"}),
             el("p", {id: "status", class: "status", role: "status"}));
  document.addEventListener("keydown", (ev) => {
    const t = ev.target;
    if (t && (t.tagName === "TEXTAREA" || t.tagName === "INPUT")) {
      if (ev.key === "Escape") t.blur();
      return;
    }
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const map = {ArrowLeft: "a", ArrowRight: "b", ArrowDown: "equal", "=": "equal", s: "skip",
                 S: "skip"};
    const c = map[ev.key];
    if (c && state.task) { ev.preventDefault(); choose(c); }
  });
}
setupLogin((me) => {
  document.getElementById("who").textContent = me.name;
  document.getElementById("session").hidden = false;
  const main = document.querySelector("main");
  main.replaceChildren(el("div", {id: "work"}));
  buildBar();
  padForBar();
  load();
});
"""

ADMIN_JS = r"""
function table(headers, rows) {
  const t = el("table", {});
  t.append(el("tr", {}, ...headers.map((h) => el("th", {scope: "col"}, h))));
  for (const r of rows) t.append(el("tr", {}, ...r.map((c) =>
    typeof c === "number" || c === null ? el("td", {class: "num"}, fmt(c)) : el("td", {}, c))));
  return t;
}
async function refresh() {
  const main = document.querySelector("main");
  let s;
  try { s = await api("/api/admin/stats"); }
  catch (e) { main.replaceChildren(el("p", {class: "status error", role: "alert"}, e.message));
              return; }
  const q = s.queue, qual = s.quality;
  const btn = el("button", {type: "button", id: "refresh"}, "Refresh");
  btn.addEventListener("click", refresh);
  main.replaceChildren(el("div", {class: "admin"},
    el("div", {class: "cards"},
      el("div", {}, el("div", {}, "Krippendorff's alpha"),
         el("div", {class: "big", id: "alpha"}, fmt(qual.krippendorff_alpha, 3))),
      el("div", {}, el("div", {}, "Cohen's kappa (mean)"),
         el("div", {class: "big", id: "kappa"}, fmt(qual.cohen_kappa_mean, 3))),
      el("div", {}, el("div", {}, "Labels"), el("div", {class: "big"}, fmt(q.labels, 0))),
      el("div", {}, el("div", {}, "Pairs complete"),
         el("div", {class: "big"}, `${q.complete_pairs} / ${q.pairs - q.gold_pairs}`))),
    el("h2", {}, "Operators"),
    table(["operator", "labels", "skips", "gold answered", "gold accuracy", "agreement",
           "median time (s)", "status"],
      qual.operators.map((o) => [o.operator, o.labels, o.skips, o.gold_answered,
        o.gold_accuracy, o.agreement, o.median_time_s,
        o.flagged ? el("span", {class: "flag"}, "flagged: excluded from export") : "ok"])),
    el("h2", {}, "Queue"),
    table(["pairs", "gold", "open", "complete", "open assignments", "labels", "skips"],
      [[q.pairs, q.gold_pairs, q.open_pairs, q.complete_pairs, q.open_assignments, q.labels,
        q.skips]]),
    el("h2", {}, "Strata"),
    table(["stratum", "tasks served", "pairs", "open"],
      s.strata.map((r) => [r.stratum, r.served, r.pairs, r.open])),
    el("h2", {}, "Cohen's kappa by operator pair"),
    table(["operators", "pairs in common", "kappa"],
      qual.cohen_kappa_pairs.map((k) => [k.operators.join(" & "), k.common, k.kappa])),
    btn));
}
setupLogin((me) => {
  document.getElementById("who").textContent = me.name;
  document.getElementById("session").hidden = false;
  if (!me.admin) {
    document.querySelector("main").replaceChildren(el("p", {class: "status error",
      role: "alert"}, "This page needs an admin token."));
    return;
  }
  refresh();
});
"""


def _v(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _shell(title: str, script: str, nav: str) -> str:
    js = LABEL_JS if script == "label.js" else ADMIN_JS
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><link rel="icon" href="/favicon.ico" sizes="16x16">
<link rel="stylesheet" href="/static/label.css?v={_v(CSS)}"></head>
<body><header class="top"><h1>{title}</h1>{nav}
<span class="who" id="session" hidden>Signed in as <strong id="who"></strong>
<span id="count-wrap"> · labelled <span id="count">0</span> this session</span> ·
<button type="button" class="link" id="sign-out">Sign out</button></span></header>
<main><p class="status">Loading…</p></main>
{{bar}}
<script src="/static/common.js?v={_v(COMMON_JS)}"></script>
<script src="/static/{script}?v={_v(js)}"></script>
</body></html>"""


BAR = """<div class="choices" id="choices" hidden role="group"
aria-label="Which segment is better?"><div class="row"></div></div>"""

LABEL_HTML = _shell("cloudrl · which segment ran the cluster better?", "label.js",
                    "").replace("{bar}", BAR)
ADMIN_HTML = _shell("cloudrl · labelling quality", "admin.js", "").replace(
    "{bar}", "").replace('<span id="count-wrap"> · labelled <span id="count">0</span> this '
                         'session</span>', "")

ASSETS = {
    "label.css": ("text/css", CSS),
    "common.js": ("application/javascript", COMMON_JS),
    "label.js": ("application/javascript", LABEL_JS),
    "admin.js": ("application/javascript", ADMIN_JS),
}
