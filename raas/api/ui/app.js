// The raas dashboard: one page, two views (#/ the service and its jobs, #/jobs/ID one job),
// read from the server's own routes every few seconds. No framework and no build step; the plots
// are uPlot's (vendored beside this file). Every text from the server goes into the page as text
// (textContent), never as HTML: trajectories hold whatever a model wrote.
"use strict";

const POLL_MS = 2000;
const PAGE = 50;
const SEARCH_MS = 250; // a search is read once typing pauses this long, not at every key
const SEARCH_CHARS = 200; // the longest search the server takes
// The filters of the finished jobs' list, each a query key of /v1/dashboard/jobs and of
// /v1/rollouts:export alike (the server reads both through one filter).
const FILTERS = ["state", "data_source", "error_type", "min_reward", "max_reward", "q"];
const STATES = ["running", "done", "failed", "timeout", "cancelled"];
const main = document.getElementById("main");
let view = 0; // bumped on every navigation: a late answer for an old view is dropped
let timer = null;
let tokenSegment = 0; // the segment of a gateway job the token view shows (from the address)

// -- small helpers ----------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") for (const [p, x] of Object.entries(v)) el.style.setProperty(p, x);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) {
    location.reload(); // the session is gone: the server answers /ui with its sign-in form
    throw new Error("signed out");
  }
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${(await r.text()).slice(0, 200)}`);
  return r.json();
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} m ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} m`;
}

function reward(r) {
  return r === null || r === undefined ? "–" : Number(r).toFixed(3).replace(/\.?0+$/, "") || "0";
}

function when(unix) {
  const d = new Date(unix * 1000);
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

function badge(state) {
  return h("span", { class: `badge ${state}` }, state);
}

function card(title, ...body) {
  return h("section", { class: "card" }, h("h2", {}, title), ...body);
}

function wide(el) {
  el.classList.add("wide");
  return el;
}

// A table; a heading written "label:num" heads a column of numbers (aligned right).
function table(head, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, head.map((c) => {
      const [label, cls] = c.split(":");
      return h("th", { class: cls || null }, label);
    }))),
    h("tbody", {}, rows));
}

function showError(err) {
  const box = document.getElementById("error");
  box.hidden = !err;
  box.textContent = err ? `Could not read the server: ${err.message}` : "";
}

function stamp() {
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
}

// Runs fn(view) now and every POLL_MS while the view is shown, until fn answers false.
function poll(fn) {
  clearTimeout(timer);
  const mine = view;
  const tick = async () => {
    if (mine !== view) return;
    let again = true;
    if (!document.hidden) {
      try {
        again = (await fn(mine)) !== false;
        showError(null);
        stamp();
      } catch (err) {
        if (mine === view) showError(err);
      }
    }
    if (mine === view && again) timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

// The overview's address with one filter set (null: removed).
function withParam(key, value) {
  const q = hashQuery();
  if (value === null || value === "") q.delete(key); else q.set(key, String(value));
  return `#/?${q}`;
}

function hashQuery() {
  const i = location.hash.indexOf("?");
  return new URLSearchParams(i < 0 ? "" : location.hash.slice(i + 1));
}

// -- the overview: the service, then the jobs ------------------------------------------------

function stagesCard(status) {
  const rows = Object.entries(status.stages).map(([name, s]) => h("tr", { "data-stage": name },
    h("td", {}, name.toUpperCase()),
    h("td", { class: "meters" }, h("div", { class: "meter", title: `${s.active} of ${s.workers} workers busy` },
      h("div", { class: "fill busy", style: { width: `${(100 * s.active) / Math.max(s.workers, 1)}%` } })),
      h("span", { class: "num" }, `${s.active} / ${s.workers}`)),
    h("td", { class: "meters" }, h("div", { class: "meter", title: `${s.queued} queued (room for ${s.queue_capacity})` },
      h("div", { class: "fill queue", style: { width: `${(100 * s.queued) / Math.max(s.queue_capacity, 1)}%` } })),
      h("span", { class: "num" }, `${s.queued} / ${s.queue_capacity}`))));
  return card("Stages",
    table(["stage", "active workers", "queued"], rows, { id: "stages" }),
    h("p", { class: "muted" }, `${status.in_flight} in flight · `,
      status.accepting ? "accepting jobs" : h("b", { class: "bad" }, "not accepting jobs (draining or paused)")));
}

function throughputCard(stats) {
  const [minute, ten] = stats.throughput;
  const perMin = (t) => (t.finished / (t.window_s / 60)).toFixed(1);
  const tokS = (t) => (t.response_tokens / t.window_s).toFixed(1);
  const counts = STATES.slice(1).map((s) => h("span", { class: "count" }, badge(s), ` ${stats.finished[s] || 0}`));
  const share = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
  return card("Throughput",
    h("div", { class: "bigs", id: "throughput" },
      h("div", {}, h("b", {}, perMin(minute)), h("span", {}, "jobs/min, last minute")),
      h("div", {}, h("b", {}, perMin(ten)), h("span", {}, "jobs/min, last 10 min")),
      h("div", {}, h("b", {}, tokS(minute)), h("span", {}, "response tokens/s, last minute"))),
    h("div", { class: "bigs", id: "rewards", title: `over the ${stats.rewarded} finished jobs with a reward, every one in the database` },
      h("div", {}, h("b", { id: "mean-reward" }, reward(stats.mean_reward)), h("span", {}, `mean reward (${stats.rewarded} rewarded)`)),
      h("div", {}, h("b", { id: "pass-rate" }, share(stats.pass_rate)), h("span", {}, "pass rate (reward ≥ 1)"))),
    h("p", { class: "counts", id: "finished" }, "finished in all: ", counts));
}

// -- plots over time: uPlot charts made once and given new data on every poll -----------------

const STAGE_COLORS = { init: "#7fa7e8", run: "#2f5bd3", eval: "#3aa56a" };
const PLOT_HEIGHT = 170;
const PLOT_WINDOW_S = 600; // the time axis spans 10 minutes at least, however few buckets there are
const COUNTS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]; // whole-number ticks
const plots = { card: null, charts: [] };

function line(label, stroke, extra) {
  return { label, stroke, width: 2, spanGaps: true, points: { show: true, size: 4 }, ...extra };
}

// Side by side: the first kind left of its bucket's time, the second right of it.
function bars(label, fill, align) {
  return { label, stroke: fill, fill, width: 1, paths: uPlot.paths.bars({ size: [0.4, 12], align }), points: { show: false } };
}

// From 0 to a little above the largest value (1 when all are 0): counts and rates never go below.
const fromZero = { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] };

// Each plot: its id, title, series (after x) and its columns of the series JSON, the y axes.
function plotSpecs(s) {
  // Ticks with the decimals they need (0.5, 40, 1.25), so that no two read the same.
  const ticks = (u, vals) => vals.map((v) => (v === null ? "" : String(+v.toFixed(2))));
  return [
    { id: "plot-reward", title: "Reward and pass rate (finished in each bucket)",
      series: [line("mean reward", "#2f5bd3"), line("pass rate", "#1f8a4c", { dash: [6, 4] })],
      data: [s.reward_mean, s.pass_rate], scales: { y: { range: [0, 1] } }, axes: [{ values: ticks }] },
    { id: "plot-throughput", title: "Throughput",
      series: [line("rollouts/min", "#2f5bd3", { scale: "y" }), line("generated tokens/s", "#a86400", { scale: "tok" })],
      data: [s.rollouts_per_min, s.generated_tokens_per_s], scales: { y: fromZero, tok: fromZero },
      axes: [{ scale: "y", values: ticks }, { scale: "tok", side: 1, grid: { show: false }, values: ticks }] },
    { id: "plot-stages", title: "Stage latency (mean seconds of the runs that ended)",
      series: ["init", "run", "eval"].map((k) => line(k.toUpperCase(), STAGE_COLORS[k])),
      data: ["init", "run", "eval"].map((k) => s.stage_s[k]), scales: { y: fromZero }, axes: [{ values: ticks }] },
    { id: "plot-errors", title: "Errors by kind, and tool calls that could not be read",
      series: [bars("infra", "#7a4fb3", -1), bars("policy", "#e0a030", 1),
        line("malformed tool calls", "#c0392b", { dash: [6, 4] })],
      data: [s.errors.infra, s.errors.policy, s.malformed_tool_calls], scales: { y: fromZero },
      axes: [{ incrs: COUNTS, values: ticks }] },
    // A job's span: its newest token's policy version minus its oldest's (weight updates that
    // landed while it was generated); a bucket none of whose jobs' backends named a version
    // has no point, not 0.
    { id: "plot-staleness", title: "Staleness (policy versions between a rollout's oldest and newest token)",
      series: [line("mean span", "#2f5bd3"), line("max span", "#c0392b", { dash: [6, 4] })],
      data: [s.staleness_mean, s.staleness_max], scales: { y: fromZero },
      axes: [{ incrs: COUNTS, values: ticks }] },
  ];
}

function plotsCard(series) {
  const specs = plotSpecs(series);
  if (!plots.card) {
    plots.cells = specs.map((p) => h("div", { class: "plot", id: p.id }, h("h3", {}, p.title)));
    plots.card = wide(card("Over time", h("p", { class: "muted", id: "plots-note" }),
      h("div", { class: "plots", id: "plots" }, plots.cells)));
  }
  const n = series.t.length;
  plots.card.querySelector("#plots-note").textContent =
    `${n} bucket${n === 1 ? "" : "s"} of ${series.bucket_s} s (counted as jobs finish; at a start, from the results in the database)`;
  plots.pending = specs;
  return plots.card;
}

// Called once the card is in the page (uPlot needs its cell's width).
function drawPlots(series) {
  if (!plots.pending) return;
  plots.pending.forEach((p, i) => {
    const data = [series.t, ...p.data];
    // What each line has to draw: its points with a value (a test reads it; so may a person).
    plots.cells[i].dataset.points = p.data.map((d) => d.filter((v) => v !== null).length).join(",");
    if (plots.charts[i]) {
      plots.charts[i].setData(data);
      return;
    }
    const cell = plots.cells[i];
    const axes = [{ space: 70 }, ...p.axes.map((a) => ({ size: 52, ...a }))];
    // From the data, not uPlot's min and max: for a single point it widens them by 1000 days.
    const x = { time: true, range: (u) => {
      const t = u.data[0];
      return [Math.min(t[0], t[t.length - 1] - PLOT_WINDOW_S), t[t.length - 1] + series.bucket_s];
    } };
    plots.charts[i] = new uPlot({
      width: Math.max(cell.clientWidth - 4, 200), height: PLOT_HEIGHT,
      series: [{}, ...p.series], scales: { x, ...p.scales }, axes,
      legend: { live: false }, cursor: { drag: { x: false, y: false } },
    }, data, cell);
  });
  document.body.dataset.plots = String(plots.charts.length);
}

window.addEventListener("resize", () => {
  plots.charts.forEach((c, i) => c.setSize({ width: Math.max(plots.cells[i].clientWidth - 4, 200), height: PLOT_HEIGHT }));
});

function backendsCard(backends) {
  if (!backends.length) {
    return card("LLM backends", h("p", { class: "muted", id: "backends" },
      "None: agent tasks fail until one is added (raas serve --llm URL, POST /v1/backends)."));
  }
  const rows = backends.map((b) => h("tr", { "data-backend": b.url, "data-healthy": String(b.healthy) },
    h("td", { class: "nowrap" }, h("span", { class: `dot ${b.healthy ? "ok" : "bad"}`, title: b.healthy ? "healthy" : "unhealthy" }),
      b.healthy ? "healthy" : "unhealthy"),
    h("td", { class: "mono" }, b.url),
    h("td", {}, b.protocol, b.model ? ` · ${b.model}` : ""),
    h("td", { class: "num" }, `${b.sessions} / ${b.capacity}`),
    h("td", { class: "num" }, String(b.requests)),
    h("td", { class: "num" }, String(b.failures)),
    h("td", { class: "err", title: b.last_error || "" }, b.last_error || "")));
  return card("LLM backends", table(["health", "url", "protocol", "sessions:num", "requests:num", "failures:num", "last error"], rows, { id: "backends" }));
}

// Horizontal bars, one a [label, count], scaled to the largest.
function barChart(id, title, entries) {
  const top = entries.reduce((a, [, n]) => Math.max(a, n), 0) || 1;
  return h("div", { class: "dist" }, h("h3", {}, title),
    h("div", { class: "bars", id }, entries.map(([label, n]) => h("div", { class: "barrow", "data-label": label, "data-count": String(n) },
      h("span", { class: "barlabel" }, label),
      h("span", { class: "bartrack" }, h("span", { class: "bar", style: { width: `${(100 * n) / top}%` } })),
      h("span", { class: "barcount num" }, String(n))))));
}

// How the last finished jobs ended and how long they ran: "every rollout hit its length limit"
// or "no rollout calls a tool" shows here first.
function distributionsCard(d) {
  if (!d.jobs) return wide(card("How jobs end", h("p", { class: "muted", id: "distributions" }, "No job has finished.")));
  const w = d.response_tokens_bin;
  const lengths = d.response_tokens.map((n, i) => [w === 1 ? String(i) : `${i * w}–${(i + 1) * w - 1}`, n]);
  return wide(card(`How the last ${d.jobs} finished jobs end`,
    h("div", { class: "dists", id: "distributions" },
      barChart("stop-reasons", "stop reason", Object.entries(d.stop_reasons)),
      barChart("turns-hist", "turns", d.turns.map((n, k) => [String(k), n])),
      barChart("length-hist", "response tokens", lengths),
      d.groups ? barChart("groups", `GRPO groups: ${(100 * d.groups_all_equal / d.groups).toFixed(0)}% teach nothing`,
        [["all equal", d.groups_all_equal], ["differ", d.groups - d.groups_all_equal]])
        : h("div", { class: "dist" }, h("h3", {}, "GRPO groups"),
          h("p", { class: "muted", id: "groups" }, "None: no two rewarded jobs here name one group (the request's group).")))));
}

// Each data_source's jobs in the whole database: which of the datasets a run mixes pays.
function sourcesCard(stats) {
  const share = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
  const states = STATES.slice(1);
  const rows = stats.sources.map((s) => h("tr", { "data-source": s.data_source },
    h("td", {}, h("a", { href: `#/?${new URLSearchParams({ data_source: s.data_source })}`, title: "list these jobs" }, s.data_source || "(none)")),
    ...states.map((state) => h("td", { class: "num", "data-state": state }, String(s.finished[state] || 0))),
    h("td", { class: "num", "data-col": "mean-reward" }, reward(s.mean_reward)),
    h("td", { class: "num", "data-col": "pass-rate" }, share(s.pass_rate)),
    h("td", { class: "num", "data-col": "per-min" }, (s.finished_recently / 10).toFixed(1))));
  return wide(card("By data source", rows.length
    ? table(["data_source", ...states.map((x) => `${x}:num`), "mean reward:num", "pass rate:num", "jobs/min, 10 min:num"], rows, { id: "sources" })
    : h("p", { class: "muted", id: "sources" }, "No job has finished.")));
}

function failuresCard(stats) {
  if (!stats.failures.length) return card("Failures by type", h("p", { class: "muted", id: "failures" }, "No job has failed."));
  const rows = stats.failures.map((f) => h("tr", { "data-failure": f.type },
    h("td", {}, h("a", { href: `#/?${new URLSearchParams({ error_type: f.type })}`, title: "list these jobs" }, f.type)),
    h("td", {}, h("span", { class: `kind ${f.kind}` }, f.kind)),
    h("td", { class: "num" }, String(f.count))));
  return card("Failures by type", table(["error", "kind", "jobs:num"], rows, { id: "failures" }));
}

function filterForm(q, stats) {
  const set = (key, value) => {
    const next = new URLSearchParams(withParam(key, value).slice(3));
    next.delete("before"); // a new filter starts from the newest
    location.hash = `#/?${next}`;
  };
  const select = (key, options) => h("select", { name: key, onchange: (e) => set(key, e.target.value) },
    options.map(([v, label]) => h("option", { value: v, selected: (q.get(key) || "") === v }, label)));
  const number = (key, label) => h("label", {}, label,
    h("input", { type: "number", step: "any", name: key, value: q.get(key) || "", onchange: (e) => set(key, e.target.value) }));
  const errors = stats.failures.map((f) => f.type);
  if (q.get("error_type") && !errors.includes(q.get("error_type"))) errors.push(q.get("error_type"));
  return h("form", { class: "filters", id: "filters", onsubmit: (e) => e.preventDefault() },
    h("label", { class: "search" }, "search",
      h("input", { type: "search", name: "q", id: "search", value: q.get("q") || "", maxlength: SEARCH_CHARS,
        placeholder: "id, data_source, task, error, judge's note", autocomplete: "off", oninput: searched })),
    h("label", {}, "state", select("state", [["", "any"], ...STATES.map((s) => [s, s])])),
    h("label", {}, "data_source", select("data_source", [["", "any"], ...stats.data_sources.map((s) => [s, s])])),
    h("label", {}, "error", select("error_type", [["", "any"], ...errors.map((s) => [s, s])])),
    number("min_reward", "reward ≥"), number("max_reward", "reward ≤"),
    h("a", { href: "#/", class: "clear" }, "clear"));
}

// The list again with what is typed in the search box, once typing pauses: the address keeps
// it (replaced, not pushed: Back does not step through every key), and the box keeps the focus
// (overview keeps a form that holds it).
let searchTimer = null;
function searched(e) {
  clearTimeout(searchTimer);
  const mine = view;
  const text = e.target.value;
  searchTimer = setTimeout(() => {
    if (mine !== view) return; // gone to another page meanwhile
    const next = hashQuery();
    if (text) next.set("q", text); else next.delete("q");
    next.delete("before"); // a new search starts from the newest
    history.replaceState(null, "", `#/?${next}`);
    view += 1;
    poll(overview);
  }, SEARCH_MS);
}

// What a search finds in a running job: its ids, data_source and task (it has no error or
// note yet), case aside, as the server matches a finished one's.
function runningMatches(j, text) {
  if (!text) return true;
  const t = text.toLowerCase();
  return [j.job_id, j.instance_id, j.data_source, j.task].some((x) => x && x.toLowerCase().includes(t));
}

function runningRows(running, q) {
  const state = q.get("state");
  if ((state && state !== "running") || q.get("min_reward") || q.get("max_reward") || q.get("error_type") || q.get("before")) return [];
  return running.jobs.filter((j) => (!q.get("data_source") || j.data_source === q.get("data_source")) && runningMatches(j, q.get("q")))
    .map((j) => h("tr", { "data-job": j.job_id, "data-state": "running" },
      jobCell(j),
      h("td", {}, badge("running"), " ", h("span", { class: "muted" }, j.state === "queued" ? `queued for ${j.stage}` : j.stage)),
      sourceCell(j),
      h("td", { class: "num" }, "–"),
      h("td", {}, j.attempts > 1 ? `attempt ${j.attempts}` : ""),
      h("td", { class: "num" }, String(j.turns)),
      h("td", { class: "num tokens", title: "response tokens so far; a turn's come when it ends (the prompt's are known from the start of RUN)" },
        String(j.response_tokens), h("span", { class: "muted small" }, ` +${j.prompt_tokens} prompt`)),
      h("td", { class: "num" }, seconds(j.elapsed_s)),
      h("td", { class: "muted" }, "running")));
}

// A job by what it is (its instance_id), its job id on hover and in its page's address.
function jobCell(j) {
  return h("td", { class: "job" }, h("a", { href: `#/jobs/${encodeURIComponent(j.job_id)}`, title: `job ${j.job_id}` },
    j.instance_id || j.job_id));
}

function sourceCell(j) {
  return h("td", {}, j.data_source, j.task && j.task !== j.data_source ? h("span", { class: "muted" }, ` (${j.task})`) : null);
}

function finishedRows(page) {
  return page.jobs.map((j) => h("tr", { "data-job": j.job_id, "data-state": j.state },
    jobCell(j),
    h("td", {}, badge(j.state)),
    sourceCell(j),
    h("td", { class: "num" }, reward(j.reward)),
    h("td", { class: "err", title: j.error_message || j.tamper || j.judge_note || "" },
      j.error_type ? h("span", {}, h("b", {}, j.error_type), h("span", { class: `kind ${j.error_kind}` }, j.error_kind), " ", j.error_message || "")
        : j.tamper ? h("span", { class: "tamper" }, h("b", {}, "tamper"), " ", j.tamper)
        : h("span", { class: "muted" }, j.stop_reason || "",
          j.judge_note ? h("span", { class: "judge", "data-judge": "" }, ` · judge: ${j.judge_note}`) : null)),
    h("td", { class: "num" }, String(j.turns)),
    h("td", { class: "num" }, String(j.response_tokens)),
    h("td", { class: "num" }, seconds(j.total_s)),
    h("td", { class: "muted" }, when(j.finished_at))));
}

function jobsQuery(q) {
  const p = filtersQuery(q);
  p.set("limit", String(PAGE));
  if (q.get("before")) p.set("before", q.get("before"));
  return p;
}

function filtersQuery(q) {
  const p = new URLSearchParams();
  for (const k of FILTERS) if (q.get(k)) p.set(k, q.get(k));
  return p;
}

// Every finished job the filters take (not only this page), as `raas export` writes them. A
// plain link: the session cookie that reads the list goes with it (same origin, GET), and the
// browser streams the file to disk rather than holding it in the page.
function exportLink(q) {
  if (q.get("state") === "running") return null; // an export is of finished jobs only
  return h("a", { id: "export", class: "export", href: `v1/rollouts:export?${filtersQuery(q)}`, download: "raas-jobs.jsonl",
    title: "every finished job these filters take, not only this page: one result a line, as raas export writes them" },
  "Export these (JSONL)");
}

async function overview(mine) {
  const q = hashQuery();
  const wantsFinished = q.get("state") !== "running";
  const [status, backends, stats, series, running, page, dists] = await Promise.all([
    get("v1/status"), get("v1/backends"), get("v1/dashboard/stats"), get("v1/dashboard/series"), get("v1/rollouts:running"),
    wantsFinished ? get(`v1/dashboard/jobs?${jobsQuery(q)}`) : Promise.resolve({ jobs: [], next_before: null }),
    get("v1/dashboard/distributions?last=1000"),
  ]);
  if (mine !== view) return;
  document.getElementById("service").textContent =
    `up ${seconds(status.uptime_s)} · tasks: ${status.tasks.join(", ")}`;
  const rows = [...runningRows(running, q), ...finishedRows(page)];
  const nav = h("p", { class: "pager" },
    q.get("before") ? h("a", { href: withParam("before", null) }, "← newest") : null,
    page.next_before ? h("a", { href: withParam("before", page.next_before) }, "older →") : null,
    exportLink(q));
  // Someone typing in a filter keeps the very element (and what is typed so far).
  const active = document.activeElement;
  const old = document.getElementById("filters");
  const form = old && old.contains(active) ? old : filterForm(q, stats);
  const jobs = wide(card("Jobs", form,
    // data-search: the search the rows were read with (a test waits for it; so may a person).
    rows.length ? table(["instance", "state", "data_source", "reward:num", "error / stop", "turns:num", "tokens:num", "time:num", "finished"], rows, { id: "jobs", "data-search": q.get("q") || "" })
      : h("p", { class: "muted", id: "jobs", "data-search": q.get("q") || "" }, "No job matches."),
    nav));
  main.replaceChildren(
    h("div", { class: "grid" }, stagesCard(status), throughputCard(stats), failuresCard(stats)),
    sourcesCard(stats), distributionsCard(dists), plotsCard(series), wide(backendsCard(backends)), jobs);
  drawPlots(series);
  if (form === old && document.activeElement !== active) active.focus();
  document.body.dataset.loaded = "overview";
}

// -- one job: its result, its conversation, its tokens ----------------------------------------

function timingBar(t) {
  const parts = [["queue", t.queue_s], ["init", t.init_s], ["run", t.run_s], ["eval", t.eval_s]];
  const total = Math.max(parts.reduce((a, [, s]) => a + s, 0), 1e-9);
  return h("div", { class: "timing" },
    h("div", { class: "bar" }, parts.map(([name, s]) => h("div", { class: `seg ${name}`, title: `${name} ${seconds(s)}`, style: { width: `${(100 * s) / total}%` } }))),
    h("div", { class: "legend" }, parts.map(([name, s]) => h("span", {}, h("i", { class: `seg ${name}` }), `${name} ${seconds(s)}`)),
      h("span", {}, `total ${seconds(t.total_s)}`)));
}

function errorBox(e, title) {
  return h("div", { class: "errorbox", "data-error-type": e.type },
    h("b", {}, title || "Error", ": ", e.type), " ", h("span", { class: `kind ${e.kind}` }, e.kind),
    e.stage ? h("span", { class: "muted" }, ` in ${e.stage.toUpperCase()}`) : null,
    h("pre", {}, e.message));
}

function summary(status, result, running) {
  const facts = [["state", badge(result ? result.state : "running")]];
  if (result) {
    facts.push(["data_source", result.data_source + (result.task && result.task !== result.data_source ? ` (task ${result.task})` : "")],
      ["reward", reward(result.reward)], ["stop", result.trajectory.stop_reason || "–"], ["attempts", String(result.attempts)]);
  } else if (running) {
    facts.push(["data_source", running.data_source + (running.task && running.task !== running.data_source ? ` (task ${running.task})` : "")],
      ["stage", running.state === "queued" ? `queued for ${running.stage}` : running.stage],
      ["turns so far", String(running.turns)], ["tokens so far", `${running.response_tokens} response + ${running.prompt_tokens} prompt`],
      ["elapsed", seconds(running.elapsed_s)], ["attempt", String(running.attempts)]);
  } else {
    facts.push(["stage", status.stage || "–"]);
  }
  return h("dl", { class: "facts", id: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

function turnsTable(turns) {
  if (!turns.length) return h("p", { class: "muted" }, "No turns.");
  const rows = turns.map((t, i) => h("tr", { "data-turn": String(t.turn ?? i) },
    h("td", { class: "num" }, String(t.turn ?? i)),
    h("td", { class: "mono" }, t.backend || ""),
    h("td", { class: "num" }, t.prompt_tokens ?? ""),
    h("td", { class: "num" }, t.output_tokens ?? ""),
    h("td", { class: "num" }, t.cached_tokens ?? ""),
    h("td", { class: "num" }, t.generate_s !== undefined ? seconds(t.generate_s) : ""),
    h("td", { class: "num" }, t.tools_s !== undefined ? seconds(t.tools_s) : ""),
    h("td", {}, t.finish_reason || t.action || ""),
    h("td", {}, (t.tool_calls || []).map((c) => c.name).join(", "))));
  return table(["turn:num", "backend", "prompt tok:num", "output tok:num", "cached:num", "generate:num", "tools:num", "finish", "calls"], rows, { id: "turns" });
}

function pretty(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

// A call's arguments one a line; text as it is (code keeps its lines), the rest as JSON.
function callArguments(args) {
  if (!args || typeof args !== "object" || Array.isArray(args)) return h("pre", {}, pretty(args));
  return h("dl", { class: "args" }, Object.entries(args).map(([k, v]) =>
    h("div", {}, h("dt", {}, k), h("dd", {}, h("pre", {}, pretty(v))))));
}

function messageCard(m, turn) {
  const role = m.role || "?";
  const body = [];
  if (role === "assistant" && turn) {
    if (turn.content) body.push(h("pre", { class: "content" }, turn.content));
    for (const c of turn.tool_calls || []) {
      body.push(h("div", { class: "call", "data-call": c.name },
        h("div", { class: "callhead" }, "→ ", h("b", {}, c.name), h("span", { class: "muted" }, c.id ? ` ${c.id}` : "")),
        callArguments(c.arguments)));
    }
    for (const e of turn.format_errors || []) body.push(h("div", { class: "errorbox" }, "format error: ", e));
    if (turn.answer !== undefined && turn.answer !== null) body.push(h("div", { class: "answer" }, "answer: ", pretty(turn.answer)));
    if (!body.length) body.push(h("pre", { class: "content" }, m.content || ""));
  } else {
    body.push(h("pre", { class: "content" }, typeof m.content === "string" ? m.content : pretty(m.content)));
  }
  const head = h("div", { class: "msghead" }, h("b", {}, role === "tool" ? `← tool output${m.name ? `: ${m.name}` : ""}` : role),
    turn ? h("span", { class: "muted" }, ` turn ${turn.turn} · ${turn.output_tokens ?? "?"} tokens · generate ${seconds(turn.generate_s)} · tools ${seconds(turn.tools_s)}`) : null);
  const el = h("div", { class: `msg ${role}`, "data-role": role }, head, body);
  return role === "system" ? h("details", { class: "msg system", "data-role": role }, h("summary", {}, "system prompt"), body) : el;
}

function conversation(traj) {
  let a = 0;
  const cards = traj.messages.map((m) => messageCard(m, m.role === "assistant" ? traj.turns[a++] : null));
  return cards.length ? h("div", { class: "messages", id: "messages" }, cards) : h("p", { class: "muted", id: "messages" }, "No messages.");
}

function shown(text) {
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

// version: the policy version that generated the token (null: unknown); newest: the trajectory's.
function tokenSpan(id, text, mask, lp, k, ids, version = null, newest = null) {
  const label = ids || text === null || text === undefined ? String(id) : shown(text);
  const attrs = { class: "tok", title: `#${k} id ${id}` };
  if (mask === undefined) {
    attrs.class += " prompt";
  } else if (mask) {
    const p = Math.exp(lp);
    attrs.class += " gen";
    attrs.title += ` · generated · logprob ${lp.toFixed(3)} · p ${p.toFixed(3)}`;
    attrs.style = { "background-color": `hsl(${Math.round(120 * p)}, 70%, ${Math.round(88 - 10 * (1 - p))}%)` };
    if (version !== null) {
      const lag = newest - version;
      attrs.title += ` · policy v${version}` + (lag ? ` · ${lag} behind the newest (v${newest})` : "");
      attrs["data-version"] = String(version);
      attrs["data-lag"] = String(lag);
      if (lag) attrs.class += " stale";
    }
  } else {
    attrs.class += " env";
    attrs.title += " · inserted by the environment (loss mask 0)";
  }
  attrs["data-mask"] = mask === undefined ? null : String(mask);
  return h("span", attrs, label);
}

function tokenView(tv, ids) {
  const gen = tv.loss_mask.filter((m) => m).length;
  const lps = tv.logprobs.filter((_, i) => tv.loss_mask[i]);
  const mean = lps.length ? lps.reduce((a, b) => a + b, 0) / lps.length : null;
  const byIds = ids || !tv.response_text;
  const versions = (tv.policy_versions || []).filter((v) => v !== null);
  // reduce, not Math.max(...): a long trajectory's tokens would overflow the argument list.
  const newest = versions.length ? versions.reduce((a, b) => Math.max(a, b)) : null;
  const oldest = versions.length ? versions.reduce((a, b) => Math.min(a, b)) : null;
  const stale = versions.filter((v) => v < newest).length;
  const response = tv.response_ids.map((id, k) =>
    tokenSpan(id, tv.response_text && tv.response_text[k], tv.loss_mask[k] ?? 0, tv.logprobs[k] ?? 0, k, byIds,
      tv.policy_versions ? tv.policy_versions[k] ?? null : null, newest));
  const prompt = tv.prompt_ids.map((id, k) => tokenSpan(id, tv.prompt_text && tv.prompt_text[k], undefined, 0, k, byIds));
  const toggle = h("label", { class: "toggle" }, h("input", { type: "checkbox", checked: byIds, disabled: !tv.response_text,
    onchange: (e) => document.getElementById("tokenview").replaceWith(tokenView(tv, e.target.checked)) }), " token ids");
  // A gateway job's calls that did not extend each other's conversation are segments of their own:
  // each has a page of its own (#/jobs/ID/segment/N), so a segment can be linked to.
  const job = encodeURIComponent(tv.job_id);
  const segments = tv.segments > 1 ? h("p", { id: "token-segments" }, `${tv.segments} segments: `,
    ...Array.from({ length: tv.segments }, (_, k) => k === tv.segment
      ? h("b", { class: "segment on" }, String(k + 1))
      : h("a", { class: "segment", href: `#/jobs/${job}/segment/${k + 1}` }, String(k + 1)))) : null;
  return h("section", { class: "card wide", id: "tokenview" },
    h("h2", {}, tv.segments > 1 ? `Tokens, segment ${tv.segment + 1} of ${tv.segments}` : "Tokens"), segments,
    h("p", { class: "muted" },
      `${tv.prompt_ids.length} prompt · ${tv.response_ids.length} response tokens: ${gen} generated, ${tv.response_ids.length - gen} inserted`,
      mean !== null ? ` · mean logprob of generated ${mean.toFixed(3)}` : "",
      h("span", { id: "token-versions" }, newest === null ? " · policy versions not reported"
        : oldest === newest ? ` · policy v${newest}` : ` · policy v${oldest}–v${newest}: ${stale} generated tokens behind the newest`),
      tv.tokenizer ? ` · decoded with ${tv.tokenizer}` : ` · ids only (${tv.note || "no tokenizer"})`, " ", toggle),
    h("p", { class: "legend" },
      h("span", { class: "tok gen", style: { "background-color": "hsl(120, 70%, 88%)" } }, "generated, p≈1"),
      h("span", { class: "tok gen", style: { "background-color": "hsl(60, 70%, 83%)" } }, "p≈0.5"),
      h("span", { class: "tok gen", style: { "background-color": "hsl(0, 70%, 78%)" } }, "p≈0"),
      h("span", { class: "tok gen stale", style: { "background-color": "hsl(120, 70%, 88%)" } }, "older policy"),
      h("span", { class: "tok env" }, "inserted (mask 0)"),
      h("span", { class: "tok prompt" }, "prompt")),
    h("details", { class: "prompt" }, h("summary", {}, `prompt (${tv.prompt_ids.length} tokens)`), h("div", { class: "tokens", id: "prompt-tokens" }, prompt)),
    h("div", { class: "tokens", id: "response-tokens" }, response.length ? response : h("span", { class: "muted" }, "No response tokens.")));
}

async function jobView(id, mine) {
  const [status, tokens] = await Promise.all([
    get(`v1/rollouts/${encodeURIComponent(id)}`), get(`v1/dashboard/jobs/${encodeURIComponent(id)}/tokens?segment=${tokenSegment}`),
  ]);
  const result = status.result;
  const running = result ? null : (await get("v1/rollouts:running")).jobs.find((j) => j.job_id === id);
  if (mine !== view) return false;
  document.getElementById("service").textContent = `job ${id}`;
  const parts = [
    h("p", {}, h("a", { href: "#/" }, "← all jobs")),
    h("section", { class: "card wide" }, h("h1", { class: "mono", id: "job-title" }, (result || running || {}).instance_id || id),
      h("p", { class: "muted mono jobid" }, "job ", h("span", { id: "job-id" }, id)), summary(status, result, running),
      result && result.error ? errorBox(result.error) : null,
      result ? (result.attempt_errors || []).map((e, i) => errorBox(e, `Attempt ${i + 1} was run again after`)) : null,
      result ? timingBar(result.timing) : null,
      result && Object.keys(result.metrics || {}).length ? h("details", {}, h("summary", {}, "metrics"), h("pre", {}, pretty(result.metrics))) : null),
  ];
  if (result) {
    const traj = result.trajectory;
    parts.push(h("section", { class: "card wide" }, h("h2", {}, "Turns"), turnsTable(traj.turns)),
      h("section", { class: "card wide" }, h("h2", {}, "Conversation"), conversation(traj)));
  } else {
    parts.push(h("p", { class: "muted" }, "Running: the conversation shows once it finishes; the tokens below are those so far."));
  }
  const ids = document.querySelector("#tokenview input[type=checkbox]");
  parts.push(tokenView(tokens, ids ? ids.checked : false));
  const open = [...main.querySelectorAll("details")].map((d) => d.open);
  main.replaceChildren(...parts);
  [...main.querySelectorAll("details")].forEach((d, i) => { if (open[i]) d.open = true; });
  document.body.dataset.loaded = "job";
  return !result; // a finished job's page is final
}

function route() {
  view += 1;
  delete document.body.dataset.loaded;
  window.scrollTo(0, 0);
  const hash = location.hash || "#/";
  if (hash.startsWith("#/jobs/")) {
    const segment = /^(.*)\/segment\/([1-9][0-9]*)$/.exec(hash.slice("#/jobs/".length));
    tokenSegment = segment ? Number(segment[2]) - 1 : 0;
    const id = decodeURIComponent(segment ? segment[1] : hash.slice("#/jobs/".length));
    main.replaceChildren(h("p", { class: "muted" }, `Loading job ${id}…`));
    poll((mine) => jobView(id, mine));
  } else {
    main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    poll(overview);
  }
}

window.addEventListener("hashchange", route);
route();
