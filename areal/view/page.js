// The viewer page: lists on the left, one episode (or two, side by side) on the right.
// Data comes from the server's /api/ endpoints, or from window.RUN_DATA in a static export.
// Every value from the run is put into the page as text (textContent), never as HTML.
"use strict";

async function api(path) {
  if (window.RUN_DATA) {
    if (!(path in window.RUN_DATA)) throw new Error("not in this export: " + path);
    return window.RUN_DATA[path];
  }
  const response = await fetch("/api/" + path.split("/").map(encodeURIComponent).join("/"));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// el("div", {class: "x", "data-id": 3}, child, "text", ...)
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
// a branch point found by entropy (rollout.branch.entropy): its sampled entropy per token
const nats = (x) => (x === null || x === undefined ? "" : `, ${Number(x).toFixed(2)} nats/token`);
const state = { episodes: [], selected: null };

// ---- lists ---------------------------------------------------------------------------------

function renderRun(run) {
  const box = document.getElementById("run");
  const s = run.summary || {};
  box.append(
    el("span", {}, "run: ", run.run_dir),
    el("span", {}, "agent: ", run.agent),
    el("span", {}, "model: ", run.model),
    el("span", {}, "γ (turn discount): ", run.gamma),
  );
  if (s.eval_before && s.eval_after) {
    box.append(el("span", {}, `held-out accuracy ${fmt(s.eval_before.sampled_acc)} → ${fmt(s.eval_after.sampled_acc)}`));
  }
  // per task (rows with a task: reasoning-gym mixes): evaluations' sampled_acc/<task>, before → after
  const tasks = taskNames([s.eval_before || {}, s.eval_after || {}], "sampled_acc/");
  if (tasks.length) {
    const acc = (e, t) => fmt((e || {})["sampled_acc/" + t]);
    box.append(el("span", { id: "task-accuracy" }, "held-out per task: ", tasks.map((t) => `${t} ${acc(s.eval_before, t)} → ${acc(s.eval_after, t)}`).join(", ")));
  }
}

// The tasks of keys "<prefix><task>" in any of ``rows`` (metrics.jsonl's reward/<task>, an evaluation's sampled_acc/<task>), sorted.
function taskNames(rows, prefix) {
  return [...new Set(rows.flatMap((r) => Object.keys(r).filter((k) => k.startsWith(prefix)).map((k) => k.slice(prefix.length))))].sort();
}

// A step's reward hacks (tasks with a world): the episodes of the reward_hack class and, per kind,
// the episodes whose sandbox saw that tripwire (metrics.jsonl's tripwires_<kind>).
function hacksOf(m) {
  const kinds = Object.keys(m).filter((k) => k.startsWith("tripwires_") && m[k] > 0);
  return { count: m.failures_reward_hack || 0, detail: kinds.map((k) => `${k.slice("tripwires_".length)} ${m[k]}`).join(", ") };
}

function renderSteps(steps) {
  const tasks = taskNames(steps, "reward/"); // one column and one curve each
  const worlds = steps.some((m) => m.failures_reward_hack > 0 || Object.keys(m).some((k) => k.startsWith("tripwires_")));
  const head = document.querySelector("#steps thead tr");
  for (const t of tasks) head.append(el("th", { class: "task", title: `mean reward of the step's ${t} episodes` }, t));
  if (worlds) head.append(el("th", { class: "hacks", title: "reward hacks (episodes with a tripwire) and the tripwires seen, by kind" }, "reward hacks"));
  const body = document.querySelector("#steps tbody");
  for (const m of steps) {
    body.append(
      el(
        "tr",
        {
          class: "step",
          "data-step": m.step,
          title: "show the episodes sampled by the policy this step started from",
          onclick: () => {
            document.getElementById("filter-version").value = String(m.version - 1);
            renderEpisodes();
          },
        },
        el("td", {}, m.step),
        el("td", {}, m.version),
        el("td", {}, fmt(m.reward_mean)),
        el("td", {}, fmt(m.loss, 4)),
        tasks.map((t) => el("td", { class: "task", "data-task": t }, fmt(m["reward/" + t]))),
        worlds && el("td", { class: "hacks", "data-hacks": hacksOf(m).count }, [hacksOf(m).count, hacksOf(m).detail && ` (${hacksOf(m).detail})`]),
      ),
    );
  }
  renderRewardChart(steps, tasks);
}

// ---- reward per step: the batch reward and one curve per task ------------------------------

const SVG_NS = "http://www.w3.org/2000/svg";
const CURVE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function renderRewardChart(steps, tasks) {
  const series = [{ key: "reward_mean", label: "batch reward", colour: "#222" }].concat(
    tasks.map((t, i) => ({ key: "reward/" + t, label: t, colour: CURVE_COLOURS[i % CURVE_COLOURS.length] })),
  );
  for (const s of series) s.points = steps.filter((m) => Number.isFinite(m[s.key])).map((m) => [m.step, m[s.key]]);
  const all = series.flatMap((s) => s.points);
  if (!all.length) return;
  const [W, H, PAD] = [480, 170, 34];
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const [x0, x1, y0] = [Math.min(...xs), Math.max(...xs), Math.min(0, ...ys)];
  const y1 = Math.max(y0 + 1e-6, ...ys);
  const sx = (x) => PAD + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - 2 * PAD);
  const sy = (y) => H - PAD + 10 - ((y - y0) / (y1 - y0)) * (H - 2 * PAD);
  const chart = svg(
    "svg",
    { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "reward per step" },
    svg("line", { class: "axis", x1: PAD, y1: sy(y0), x2: W - PAD, y2: sy(y0) }),
    svg("line", { class: "axis", x1: PAD, y1: sy(y0), x2: PAD, y2: sy(y1) }),
    svg("text", { x: 2, y: sy(y1) + 4 }, fmt(y1, 2)),
    svg("text", { x: 2, y: sy(y0) + 4 }, fmt(y0, 2)),
    svg("text", { x: sx(x0) - 3, y: H - 6 }, `step ${x0}`),
    svg("text", { x: sx(x1) - 20, y: H - 6 }, `step ${x1}`),
  );
  for (const s of series) {
    if (!s.points.length) continue;
    const points = s.points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" ");
    chart.append(svg("polyline", { class: "curve", "data-key": s.key, points, stroke: s.colour }, svg("title", {}, s.label)));
    for (const [x, y] of s.points) chart.append(svg("circle", { cx: sx(x), cy: sy(y), r: 2, fill: s.colour }, svg("title", {}, `${s.label}, step ${x}: ${fmt(y)}`)));
  }
  const legend = el("div", { class: "chart-legend" }, series.map((s) => el("span", {}, el("span", { class: "swatch", style: `background:${s.colour}` }), s.label)));
  document.getElementById("reward-chart").replaceChildren(chart, legend);
}

function fillSelect(id, values) {
  const select = document.getElementById(id);
  for (const v of [...new Set(values)].sort()) select.append(el("option", { value: v }, v === "" ? "(none)" : v));
  select.addEventListener("change", renderEpisodes);
}

function renderFilters(episodes) {
  fillSelect("filter-status", episodes.map((e) => e.status));
  fillSelect("filter-class", episodes.map((e) => e.failure_class || "").filter((c) => c !== ""));
  fillSelect("filter-version", episodes.flatMap((e) => (e.versions || []).map(String)));
  for (const id of ["filter-reward-min", "filter-reward-max"]) document.getElementById(id).addEventListener("input", renderEpisodes);
}

function visibleEpisodes() {
  const value = (id) => document.getElementById(id).value;
  const low = value("filter-reward-min"), high = value("filter-reward-max");
  return state.episodes.filter(
    (e) =>
      (!value("filter-status") || e.status === value("filter-status")) &&
      (!value("filter-class") || e.failure_class === value("filter-class")) &&
      (!value("filter-version") || (e.versions || []).map(String).includes(value("filter-version"))) &&
      (low === "" || (e.reward ?? 0) >= Number(low)) &&
      (high === "" || (e.reward ?? 0) <= Number(high)),
  );
}

function renderEpisodes() {
  const body = document.querySelector("#episodes tbody");
  const shown = visibleEpisodes();
  body.replaceChildren(
    ...shown.map((e) =>
      el(
        "tr",
        {
          class: "episode" + (e.episode_id === state.selected ? " selected" : ""),
          "data-id": e.episode_id,
          "data-status": e.status,
          "data-class": e.failure_class || "",
          title: e.error || "",
          onclick: () => (location.hash = "episode=" + encodeURIComponent(e.episode_id)),
        },
        el("td", {}, e.episode_id, e.branch ? el("span", { class: "badge branch", title: `branch ${e.branch.index} of ${e.branch.of}` }, `at call ${e.branch.call}${nats(e.branch.entropy)}`) : ""),
        el("td", { class: "status-" + e.status }, e.status),
        el("td", {}, e.failure_class ? `${e.failure_class}: ${e.failure_cause}` : ""),
        el("td", {}, fmt(e.reward)),
        el("td", {}, (e.versions || []).join(",")),
        el("td", {}, e.calls, e.drift ? ` (drift ${e.drift})` : "", e.tree ? "" : " (not recorded)"),
      ),
    ),
  );
  document.getElementById("episode-count").textContent = `${shown.length} of ${state.episodes.length} episodes`;
}

function renderPrompts(prompts) {
  const list = document.getElementById("prompts");
  if (!prompts.length) list.append(el("li", { class: "hint" }, "no prompt was sampled at two policy versions"));
  for (const p of prompts) {
    const versions = p.episodes.map((e) => (e.versions || []).join(","));
    list.append(
      el(
        "li",
        {},
        el("a", { href: "#compare=" + encodeURIComponent(p.episodes[0].episode_id), class: "compare-link" }, p.prompt),
        ` (${p.episodes.length} episodes, versions ${versions[0]} … ${versions[versions.length - 1]})`,
      ),
    );
  }
}

// ---- one episode ---------------------------------------------------------------------------

// An episode with a world (sandbox/world.py): the grader's verdict per check and the tripwires it saw.
function worldBox(r) {
  const checks = Object.entries(r.checks || {});
  return el(
    "div",
    { class: "world" },
    el("b", {}, `grader: ${r.grader}`),
    el("ul", { class: "checks" }, checks.map(([name, v]) => el("li", { class: v >= 1 ? "passed" : "not-passed" }, `${name}: ${fmt(v, 1)}`))),
    (r.tripwires || []).length
      ? el("div", { class: "tripwires" }, el("b", {}, "tripwires: "), el("ul", {}, r.tripwires.map((t) => el("li", {}, t))))
      : el("div", { class: "tripwires none" }, "no tripwire"),
  );
}

function failureBox(f) {
  return el(
    "div",
    { class: "failure" },
    el("b", {}, `${f.status}${f.failure_class ? ` · ${f.failure_class} failure` : ""}${f.failure_cause ? ` (${f.failure_cause})` : ""}`),
    "\n",
    f.error || "",
    f.log_tail ? "\n--- log tail ---\n" + f.log_tail : "",
  );
}

function messageBox(m) {
  const calls = (m.tool_calls || []).map((c) =>
    c.malformed !== undefined
      ? el("div", { class: "tool-call malformed" }, "malformed tool call: ", c.malformed)
      : el("div", { class: "tool-call" }, "tool call ", c.name, "(", JSON.stringify(c.arguments), ")"),
  );
  const results = (m.tool_results || []).map((r) => el("div", { class: "tool-result" }, "tool result: ", r));
  const role = results.length && !m.content ? "tool" : m.role;
  return el("div", { class: "msg " + m.role }, el("span", { class: "role" }, role), m.content, calls, results);
}

function tokenSpans(node) {
  const prompt = node.prompt_tokens.map((t) => el("span", { class: "tok", "data-mask": 0 }, t));
  const output = node.output_tokens.map(([t, lp, v]) =>
    el("span", { class: "tok", "data-mask": 1, "data-logprob": lp, "data-version": v, title: `logprob ${lp} · p ${fmt(Math.exp(lp))} · version ${v}` }, t),
  );
  return el("div", { class: "tokens" }, prompt, output);
}

function renderNode(node, byId, index) {
  const classes = ["node", node.fork && "fork", node.drift && "drift", node.failure && "failed"].filter(Boolean).join(" ");
  const box = el(
    "div",
    { class: classes, "data-call": node.id },
    el(
      "div",
      { class: "node-head" },
      el("b", {}, `call ${index.get(node.id) + 1}`),
      el("span", { class: "reward" }, "reward ", fmt(node.reward)),
      el("span", { class: "return" }, "return ", fmt(node.return)),
      el("span", {}, "trained with ", fmt(node.trained)),
      el("span", {}, "finish ", node.finish_reason),
      el("span", {}, node.output_tokens.length, " sampled tokens"),
      node.fork && el("span", { class: "badge fork" }, `fork: ${node.children.length} continuations`),
      node.drift && el("span", { class: "badge drift" }, "drift: history rewritten, new branch"),
      node.shared && el("span", { class: "badge shared" }, "shared prefix: made once, before the branch point"),
      node.branch_point && el("span", { class: "badge branch" }, `branch point: branch ${node.branch_point.index} of ${node.branch_point.of}`),
      node.failure && el("span", { class: "badge fail" }, "failed here"),
    ),
    node.messages.map(messageBox),
    messageBox(node.output),
    el("details", { open: true }, el("summary", {}, "tokens (new prompt tokens, then sampled ones)"), tokenSpans(node)),
    node.failure && failureBox(node.failure),
  );
  if (node.children.length) box.append(el("div", { class: "children" }, node.children.map((c) => renderNode(byId.get(c), byId, index))));
  return box;
}

function renderEpisode(ep) {
  const r = ep.record;
  const byId = new Map(ep.nodes.map((n) => [n.id, n]));
  const index = new Map(ep.nodes.map((n, i) => [n.id, i]));
  const roots = ep.nodes.filter((n) => !byId.has(n.parent));
  return el(
    "div",
    { class: "episode-view", "data-id": r.episode_id },
    el(
      "div",
      { class: "episode-head" },
      el("b", {}, r.episode_id),
      ` · ${r.status}${r.failure_class ? ` (${r.failure_class}: ${r.failure_cause})` : ""}`,
      ` · reward ${fmt(r.reward)} · versions ${(r.versions || []).join(",")} · ${r.interactions} calls`,
      r.drift ? ` · drift ${r.drift}` : "",
      ` · γ ${ep.gamma} · `,
      el("a", { href: "#compare=" + encodeURIComponent(r.episode_id) }, "same prompt early and late"),
      ep.branch &&
        el(
          "span",
          { class: "branch-of" },
          ` · branch ${ep.branch.index} of ${ep.branch.of} at call ${ep.branch.call}${nats(ep.branch.entropy)}; siblings: `,
          ...ep.branch.siblings.flatMap((s) => [el("a", { href: "#episode=" + encodeURIComponent(s), class: "sibling" }, s), " "]),
        ),
    ),
    r.grader && worldBox(r),
    !ep.recorded && el("p", { class: "hint" }, "its calls were not recorded (no calls, or over the run's view_record_mb)"),
    roots.map((n) => renderNode(n, byId, index)),
    ep.failure && !ep.nodes.length && failureBox(ep.failure),
  );
}

async function showEpisode(id) {
  state.selected = id;
  renderEpisodes();
  const detail = document.getElementById("detail");
  detail.replaceChildren(renderEpisode(await api("episode/" + id)));
  colourTokens();
}

async function showCompare(id) {
  const c = await api("compare/" + id);
  const [early, late] = await Promise.all([api("episode/" + c.early), api("episode/" + c.late)]);
  const side = (label, ep) => el("div", { class: "side", "data-side": label }, el("h2", {}, label), renderEpisode(ep));
  document
    .getElementById("detail")
    .replaceChildren(el("p", {}, `${c.count} episodes share this prompt; the earliest and the latest:`), el("div", { id: "compare" }, side("early", early), side("late", late)));
  colourTokens();
}

// ---- colours -------------------------------------------------------------------------------

const VERSION_HUES = [210, 30, 120, 280, 0, 170, 60, 320];

function colourTokens() {
  const mode = document.getElementById("colour").value;
  for (const t of document.querySelectorAll(".tok")) {
    const sampled = t.dataset.mask === "1";
    let colour = sampled ? "#c8f0c0" : "#e4e4e4";
    if (mode === "logprob" && sampled) colour = `hsl(${Math.round(120 * Math.exp(Number(t.dataset.logprob)))}, 75%, 78%)`;
    if (mode === "version" && sampled) colour = `hsl(${VERSION_HUES[Number(t.dataset.version) % VERSION_HUES.length]}, 70%, 80%)`;
    if (mode !== "mask" && !sampled) colour = "transparent";
    t.style.background = colour;
  }
  const keys = {
    mask: [["#c8f0c0", "1: sampled, trained"], ["#e4e4e4", "0: prompt, not trained"]],
    logprob: [["hsl(0,75%,78%)", "p≈0"], ["hsl(60,75%,78%)", "p≈0.5"], ["hsl(120,75%,78%)", "p≈1"]],
    version: VERSION_HUES.slice(0, 4).map((h, v) => [`hsl(${h},70%,80%)`, `v${v} (mod ${VERSION_HUES.length})`]),
  }[mode];
  document.getElementById("legend-keys").replaceChildren(...keys.map(([c, label]) => el("span", { class: "key", style: `background:${c}` }, label)));
}

// ---- start ---------------------------------------------------------------------------------

async function route() {
  const [kind, value] = location.hash.slice(1).split("=");
  const id = decodeURIComponent(value || "");
  try {
    if (kind === "episode") await showEpisode(id);
    else if (kind === "compare") await showCompare(id);
  } catch (error) {
    document.getElementById("detail").replaceChildren(el("p", { class: "failure" }, String(error.message || error)));
  }
}

async function start() {
  const [run, steps, episodes, prompts] = await Promise.all([api("run"), api("steps"), api("episodes"), api("prompts")]);
  state.episodes = episodes;
  renderRun(run);
  renderSteps(steps);
  renderFilters(episodes);
  renderEpisodes();
  renderPrompts(prompts);
  document.getElementById("colour").addEventListener("change", colourTokens);
  colourTokens();
  window.addEventListener("hashchange", route);
  await route();
  document.body.dataset.ready = "1"; // for tests and scripts: the lists are on the page
}

start();
