// zeropilot console: one static page over the /v1 API. The bearer token lives in the browser's
// sessionStorage (or localStorage when asked) and travels only in the Authorization header.
// Charts are SVG drawn here: nothing is fetched from anywhere but this server.

const TOKEN_KEY = "zeropilot.token";
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const STATUSES = ["PENDING", "QUEUED", "LAUNCHING", "RUNNING", "ESCALATING", "SUCCEEDED",
  "FAILED", "CANCELLED"];
const SEGMENTS = { // what holds the memory, bottom to top, as `zeropilot advise --chart`
  params: "#4e79a7", gradients: "#f28e2b", optimizer: "#e15759", buffers: "#76b7b2",
  activations: "#59a14f", temporaries: "#edc948", overhead: "#bab0ac",
};
const ATTEMPT_COLOURS = ["#2f5fd0", "#d9480f", "#12805c", "#862e9c", "#c0362c"];
const SVG_NS = "http://www.w3.org/2000/svg";

let me = null;
let timers = [];

// ---------- small DOM helpers (text goes in as text, never as HTML) ----------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}
function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}
const main = () => document.getElementById("main");
// replaceChildren, leaving out the nulls that conditional parts give (it would print "null").
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}
function show(...nodes) { fill(main(), ...nodes); }
function every(ms, fn) { timers.push(setInterval(fn, ms)); }
// Each route() starts a new page; a view still loading when the user moved on must neither paint
// over the new page nor leave its timer running, so views paint through current().
let generation = 0;
function current() {
  const mine = generation;
  const live = () => mine === generation;
  return { live, show: (...nodes) => live() && show(...nodes), every: (ms, fn) => live() && every(ms, fn) };
}

// ---------- formatting ----------
function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  if (Math.abs(n) >= 1024 ** 3) return `${(n / 1024 ** 3).toFixed(2)} GiB`;
  return `${(n / 1024 ** 2).toFixed(2)} MiB`;
}
function utc(iso) { return new Date(/Z|[+-]\d\d:\d\d$/.test(iso) ? iso : `${iso}Z`); }
function fmtTime(iso) { return iso ? utc(iso).toISOString().replace("T", " ").slice(0, 19) : "—"; }
function fmtAge(iso) {
  const s = Math.max(0, (Date.now() - utc(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}
function planLabel(p) {
  if (!p || p.zero_stage === undefined) return "—";
  const offload = p.offload_param === "cpu" ? "opt+params" : p.offload_optimizer === "cpu" ? "opt" : "none";
  return `ZeRO-${p.zero_stage} offload=${offload} ckpt=${p.activation_checkpointing ? "on" : "off"} ` +
    `mb=${p.micro_batch_size}×${p.gradient_accumulation_steps}`;
}
const badge = (status) => el("span", { class: `status ${status}` }, status);

// ---------- the API, with the token in a header ----------
function token() { return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY); }
class ApiError extends Error {
  constructor(status, body) { super(describe(body) || `HTTP ${status}`); this.status = status; }
}
function describe(body) {
  if (!body || typeof body !== "object") return body;
  const d = body.detail;
  if (Array.isArray(d)) return d.map((e) => `${(e.loc || []).filter((l) => l !== "body").join(".")}: ${e.msg}`).join("\n");
  return typeof d === "string" ? d : JSON.stringify(d);
}
async function api(path, { method = "GET", json, text, headers = {}, raw = false } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${token()}`, ...headers } };
  if (json !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(json); }
  if (text !== undefined) { init.headers["Content-Type"] = "text/plain"; init.body = text; }
  const response = await fetch(path, init);
  if (response.status === 401) { signOut(); throw new ApiError(401, { detail: "signed out: the token was refused" }); }
  const isJson = (response.headers.get("content-type") || "").includes("json");
  const body = isJson ? await response.json() : await response.text();
  if (!response.ok) throw new ApiError(response.status, body);
  return raw ? { body, response } : body;
}

// ---------- sign-in ----------
function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  localStorage.removeItem(TOKEN_KEY);
  me = null;
  route();
}
function signInView() {
  const input = el("input", { type: "password", id: "token", autocomplete: "off",
    placeholder: "bearer token (zeropilot up prints it; zeropilot users create makes one)" });
  const remember = el("input", { type: "checkbox", id: "remember" });
  const error = el("p", { class: "error", id: "sign-in-error" });
  const form = el("form", { class: "card", id: "sign-in", onsubmit: async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    const response = await fetch("/v1/me", { headers: { Authorization: `Bearer ${candidate}` } });
    if (!response.ok) { error.textContent = "That token was not accepted."; return; }
    (remember.checked ? localStorage : sessionStorage).setItem(TOKEN_KEY, candidate);
    me = await response.json();
    route();
  } },
  el("h1", {}, "Sign in"),
  el("p", { class: "muted" }, "With the same token as the CLI and the API. It is kept in this browser only."),
  el("div", { class: "row" }, input, el("button", { type: "submit" }, "Sign in")),
  el("label", { class: "small" }, remember, " keep me signed in on this browser"),
  error);
  show(form);
  input.focus();
}

// ---------- router ----------
async function route() {
  const mine = ++generation;
  timers.forEach(clearInterval);
  timers = [];
  const who = document.getElementById("who");
  const out = document.getElementById("sign-out");
  if (!token()) { who.textContent = ""; out.hidden = true; signInView(); return; }
  if (!me) {
    try { me = await api("/v1/me"); } catch (e) { if (!token()) return; show(errorBox(e)); return; }
    if (mine !== generation) return;  // the user moved on while it loaded
  }
  who.textContent = `${me.name} · ${me.team}${me.is_admin ? " · admin" : ""}${me.role && me.role !== "member" ? ` · ${me.role}` : ""}`;
  out.hidden = false;
  const [, page, id] = (location.hash || "#/jobs").split("/");
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === page));
  const views = { jobs: () => (id ? jobView(decodeURIComponent(id)) : jobsView()), advisor: advisorView, calibration: calibrationView, teams: teamsView };
  try { await (views[page] || jobsView)(); } catch (e) { if (mine === generation) show(errorBox(e)); }
}
const errorBox = (e) => el("div", { class: "card error" }, String(e.message || e));

// ---------- jobs list and submission ----------
async function jobsView() {
  const screen = current();
  const statusSelect = el("select", { id: "filter-status" }, el("option", { value: "" }, "all statuses"),
    STATUSES.map((s) => el("option", { value: s }, s)));
  const teamSelect = el("select", { id: "filter-team", hidden: !me.is_admin }, el("option", { value: "" }, "all teams"));
  if (me.is_admin) {
    for (const t of await api("/v1/teams")) teamSelect.append(el("option", { value: t.name }, t.name));
  }
  const table = el("tbody", { id: "jobs" });
  const count = el("span", { class: "muted small" });
  const refresh = async () => {
    const query = new URLSearchParams();
    if (statusSelect.value) query.set("status", statusSelect.value);
    if (teamSelect.value) query.set("team", teamSelect.value);
    const rows = await api(`/console/api/jobs?${query}`);
    count.textContent = `${rows.count} job${rows.count === 1 ? "" : "s"}`;
    fill(table, ...rows.data.map(jobRow));
    if (!rows.data.length) table.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No jobs yet.")));
  };
  statusSelect.addEventListener("change", refresh);
  teamSelect.addEventListener("change", refresh);
  screen.show(
    submitCard(),
    el("div", { class: "card" },
      el("div", { class: "row" }, el("h2", { style: "flex:1;margin:0" }, "Jobs"), count, statusSelect, teamSelect),
      el("table", {}, el("thead", {}, el("tr", {}, ["name", "team", "status", "cluster", "nodes × GPUs",
        "plan", "attempts", "age"].map((h) => el("th", {}, h)))), table)),
  );
  await refresh();
  screen.every(3000, () => refresh().catch(() => {}));
}
function jobRow(job) {
  return el("tr", { class: "clickable", "data-job": job.id, onclick: () => { location.hash = `#/jobs/${job.id}`; } },
    el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.name), el("div", { class: "muted small" }, job.id)),
    el("td", {}, job.team),
    el("td", {}, badge(job.status), job.message ? el("div", { class: "muted small" }, job.message) : null),
    el("td", {}, job.cluster, job.borrowing ? el("div", { class: "muted small" }, "borrowing") : null),
    el("td", {}, `${job.nodes} × ${job.gpus_per_node}`),
    el("td", { class: "small" }, planLabel(job.plan)),
    el("td", {}, String(job.attempts), job.preemptions ? el("div", { class: "muted small preempted" }, `preempted ${job.preemptions}×`) : null),
    el("td", { title: fmtTime(job.created_at) }, fmtAge(job.created_at)));
}
function submitCard() {
  const spec = el("textarea", { id: "spec", spellcheck: "false",
    placeholder: "A job spec in YAML or JSON, as for `zeropilot submit` (set working_dir to the folder of the entrypoint)." });
  const file = el("input", { type: "file", accept: ".yaml,.yml,.json", onchange: async () => {
    if (file.files[0]) spec.value = await file.files[0].text();
  } });
  const result = el("div", { id: "submit-result" });
  const submit = async () => {
    fill(result);
    try {
      const body = await api("/console/api/spec", { method: "POST", text: spec.value });
      const job = await api("/v1/jobs", { method: "POST", json: body });
      location.hash = `#/jobs/${job.id}`;
    } catch (e) { fill(result, el("p", { class: "error" }, e.message)); }
  };
  return el("details", { class: "card", id: "submit-card" },
    el("summary", {}, "Submit a job"),
    spec,
    el("div", { class: "row" }, el("button", { id: "submit", onclick: submit }, "Submit"), file),
    result);
}

// ---------- one job ----------
async function jobView(id) {
  const screen = current();
  const [job, clusters] = await Promise.all([api(`/v1/jobs/${id}`), api("/console/api/clusters")]);
  const budget = (clusters.find((c) => c.name === job.cluster) || {}).budget_bytes;
  const sections = {
    head: el("div", { class: "card", id: "job-head" }),
    plan: el("div", { class: "card", id: "job-plan" }),
    attempts: el("div", { class: "card", id: "job-attempts" }),
    loss: el("div", { class: "card", id: "loss-card" }),
    rate: el("div", { class: "card", id: "rate-card" }),
    memory: el("div", { class: "card", id: "memory-card" }),
    checkpoints: el("div", { class: "card", id: "job-checkpoints" }),
  };
  const log = logPanel(id);
  const spec = el("div", { class: "card" }, el("details", {}, el("summary", {}, "Spec"),
    el("pre", { id: "job-spec" }, JSON.stringify(job.spec, null, 2))));
  screen.show(sections.head, sections.plan, el("div", { class: "grid2" }, sections.loss, sections.rate),
    sections.attempts, sections.memory, sections.checkpoints, log.node, spec);
  const paint = (j) => {
    renderHead(sections.head, j);
    renderPlan(sections.plan, j);
    renderAttempts(sections.attempts, j);
    renderCurves(sections.loss, sections.rate, j);
    renderMemory(sections.memory, j, budget);
    renderCheckpoints(sections.checkpoints, j);
  };
  paint(job);
  await log.poll(job);
  screen.every(2000, async () => {
    const fresh = await api(`/v1/jobs/${id}`).catch(() => null);
    if (!fresh) return;
    paint(fresh);
    await log.poll(fresh).catch(() => {});
  });
}
function renderHead(node, job) {
  const cancel = TERMINAL.has(job.status) || me.role === "viewer" ? null : el("button", { class: "danger", id: "cancel", onclick: async () => {
    if (!confirm(`Cancel job ${job.name} (${job.id})?`)) return;
    try { await api(`/v1/jobs/${job.id}/cancel`, { method: "POST" }); } catch (e) { alert(e.message); }
  } }, "Cancel");
  const res = job.spec.resources;
  fill(node,
    el("div", { class: "row" }, el("h1", { style: "flex:1" }, job.name, " ", badge(job.status)), cancel),
    el("div", { class: "muted" }, `${job.id} · team ${job.team} · cluster ${job.cluster} · ${res.nodes} × ${res.gpus_per_node} GPUs · priority ${job.priority} · submitted ${fmtTime(job.created_at)} (${fmtAge(job.created_at)} ago)`),
    job.message ? el("p", { id: "job-message" }, job.message) : null,
    sharingLine(job));
}
function sharingLine(job) {  // borrowing and preemptions (docs/scheduling.md), like the CLI's status
  const parts = [];
  if (job.borrowing) parts.push("borrowing idle GPUs past its team's quota");
  if (job.preempted_by.length) parts.push(`preempted ${job.preempted_by.length}× (by job ${job.preempted_by.join(", ")})`);
  return parts.length ? el("p", { id: "job-sharing", class: "muted" }, `sharing: ${parts.join("; ")}`) : null;
}
function renderPlan(node, job) {
  const download = el("button", { class: "secondary", onclick: () => downloadJson(job.plan.ds_config, "ds_config.json") }, "Download ds_config.json");
  fill(node, el("div", { class: "row" }, el("h2", { style: "flex:1" }, "Plan"), download),
    el("p", { id: "plan-label" }, el("b", {}, planLabel(job.plan))),
    el("p", { class: "muted" }, job.advice_reason));
}
function renderAttempts(node, job) {
  const previous = {};
  const items = job.attempts.map((a) => {
    const before = previous.plan;
    previous.plan = a.plan;
    const change = before && planLabel(before) !== planLabel(a.plan) ? `${planLabel(before)} → ${planLabel(a.plan)}` : null;
    const evidence = job.attempts.find((x) => x.number === a.number - 1);
    return el("div", { class: `attempt ${a.status}`, "data-attempt": a.number },
      el("div", { class: "row" }, el("b", {}, `attempt ${a.number}`), badge(a.status), el("span", { class: "muted" }, a.rung)),
      change ? el("div", {}, "escalation: ", el("b", {}, change)) : el("div", { class: "small" }, planLabel(a.plan)),
      change && evidence ? el("div", { class: "small evidence" }, `evidence: ${evidenceLine(evidence)}`) : null,
      a.resumed_from ? el("div", { class: "small muted" }, `resumed from ${a.resumed_from} (${a.resume_method})`) : null,
      el("div", { class: "small muted" }, `queued ${fmtTime(a.created_at)} · started ${fmtTime(a.started_at)} · ended ${fmtTime(a.finished_at)}` +
        (a.exit_code !== null ? ` · exit ${a.exit_code}` : "") + (a.failure_class ? ` · ${a.failure_class}` : "")),
      a.failure_message && a.status !== "SUCCEEDED" ? el("div", { class: "small error" }, a.failure_message) : null);
  });
  fill(node, el("h2", {}, "Attempts"), timeline(job), ...items,
    el("details", {}, el("summary", {}, `Events (${job.events.length})`), el("table", {},
      job.events.map((e) => el("tr", {}, el("td", { class: "small" }, fmtTime(e.created_at)), el("td", {}, e.subject),
        el("td", {}, e.to_status), el("td", { class: "small" }, e.reason))))));
}
function evidenceLine(attempt) {
  // What the failed attempt left: the numbers parsed from its OOM text, else its summary.
  const evidence = attempt.failure_evidence || {};
  const numbers = Object.entries(evidence.numbers || {}).filter(([, v]) => typeof v === "number")
    .map(([k, v]) => (k.endsWith("_bytes") ? `${k.slice(0, -6).replaceAll("_", " ")} ${fmtBytes(v)}` : `${k.replaceAll("_", " ")} ${v}`));
  const head = [attempt.failure_class, ...numbers].filter(Boolean).join(", ");
  return numbers.length ? head : [attempt.failure_class, attempt.failure_message].filter(Boolean).join(": ");
}
function timeline(job) {
  // One lane per attempt, from queued to ended (or now), on the job's own time axis.
  const W = 1180, lane = 22, L = 90, R = 10;
  const start = utc(job.created_at).getTime();
  const end = Math.max(start + 1000, ...job.attempts.map((a) => (a.finished_at ? utc(a.finished_at) : new Date()).getTime()));
  const x = (t) => L + (W - L - R) * (t - start) / (end - start);
  const rows = job.attempts.map((a, i) => {
    const y = 6 + i * lane;
    const q = utc(a.created_at).getTime(), s = a.started_at ? utc(a.started_at).getTime() : null;
    const f = a.finished_at ? utc(a.finished_at).getTime() : end;
    return svg("g", {}, svg("text", { x: 0, y: y + 12, "font-size": 12 }, `attempt ${a.number}`),
      svg("rect", { x: x(q), y, width: Math.max(2, x(s ?? f) - x(q)), height: 14, fill: "#c9d3e6" }, svg("title", {}, "queued / launching")),
      s ? svg("rect", { x: x(s), y, width: Math.max(2, x(f) - x(s)), height: 14, fill: ATTEMPT_COLOURS[i % 5] }, svg("title", {}, `running, then ${a.status}`)) : null);
  });
  const H = 12 + job.attempts.length * lane + 14;
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", class: "timeline" }, rows,
    svg("text", { x: L, y: H - 2, "font-size": 11, fill: "#667085" }, fmtTime(job.created_at)),
    svg("text", { x: W - R, y: H - 2, "font-size": 11, fill: "#667085", "text-anchor": "end" }, `+${Math.round((end - start) / 1000)} s`));
}
function renderCurves(lossNode, rateNode, job) {
  const numbers = Object.fromEntries(job.attempts.map((a) => [a.id, a.number]));
  const series = (field) => job.metrics.filter((m) => m[field] !== null).map((m) => ({ x: m.step, y: m[field], attempt: numbers[m.attempt_id] }));
  fill(lossNode, el("h2", {}, "Loss"), lineChart("loss-chart", series("loss"), "loss"));
  fill(rateNode, el("h2", {}, "Tokens / s"), lineChart("rate-chart", series("tokens_per_s"), "tokens/s"));
}
function renderMemory(node, job, budget) {
  const rows = job.attempts.map((a) => {
    const peaks = job.metrics.filter((m) => m.attempt_id === a.id && m.memory_peak_bytes !== null).map((m) => m.memory_peak_bytes);
    return { label: `attempt ${a.number}`, predicted: a.plan.per_gpu_bytes ? a.plan.per_gpu_bytes.total : null, peak: peaks.length ? Math.max(...peaks) : null };
  });
  fill(node, el("h2", {}, "Memory per GPU (per rank on CPU clusters)"),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#4e79a7" }), "predicted"),
      el("span", {}, el("i", { style: "background:#e15759" }), "reported peak"),
      el("span", {}, el("i", { style: "background:#000" }), `budget ${fmtBytes(budget)}`)),
    memoryChart(rows, budget));
}
function memoryChart(rows, budget) {
  const W = 1180, L = 90, R = 180, lane = 36;
  const top = Math.max(budget || 0, ...rows.flatMap((r) => [r.predicted || 0, r.peak || 0])) * 1.05 || 1;
  const x = (v) => L + (W - L - R) * v / top;
  const H = rows.length * lane + 8;
  const bars = rows.map((r, i) => {
    const y = 4 + i * lane;
    return svg("g", {}, svg("text", { x: 0, y: y + 18, "font-size": 12 }, r.label),
      svg("rect", { x: L, y, width: x(r.predicted || 0) - L, height: 13, fill: "#4e79a7", class: "predicted" }),
      svg("text", { x: x(r.predicted || 0) + 4, y: y + 11, "font-size": 11 }, `predicted ${fmtBytes(r.predicted)}`),
      svg("rect", { x: L, y: y + 15, width: x(r.peak || 0) - L, height: 13, fill: "#e15759", class: "peak" }),
      svg("text", { x: x(r.peak || 0) + 4, y: y + 26, "font-size": 11 }, r.peak === null ? "no peak reported" : `reported ${fmtBytes(r.peak)}`));
  });
  const line = budget ? [svg("line", { x1: x(budget), x2: x(budget), y1: 0, y2: H, stroke: "#000", "stroke-dasharray": "5 4" }),
    svg("text", { x: x(budget) + 4, y: 12, "font-size": 11 }, `budget ${fmtBytes(budget)}`)] : [];
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", id: "memory-chart" }, bars, line);
}
function renderCheckpoints(node, job) {
  const numbers = Object.fromEntries(job.attempts.map((a) => [a.id, a.number]));
  const kept = job.checkpoints.filter((c) => !c.deleted_at).length;
  const deleted = job.checkpoints.length - kept;
  const state = (c) => c.deleted_at ? `deleted ${fmtTime(c.deleted_at)}` : c.complete === null ? "not checked yet" : c.complete ? "complete" : "incomplete";
  fill(node, el("h2", {}, `Checkpoints (${kept} kept, ${fmtBytes(job.checkpoint_bytes || 0)}; ${deleted} deleted)`),
    job.checkpoints.length ? el("table", {}, el("thead", {}, el("tr", {}, ["step", "attempt", "path", "saved", "size", "state"].map((h) => el("th", {}, h)))),
      el("tbody", {}, job.checkpoints.map((c) => el("tr", {}, el("td", {}, String(c.step)), el("td", {}, String(numbers[c.attempt_id])),
        el("td", { class: "small" }, c.path), el("td", { class: "small" }, fmtTime(c.created_at)),
        el("td", { class: "small" }, c.size_bytes === null ? "?" : fmtBytes(c.size_bytes)), el("td", { class: "small" }, state(c))))))
      : el("p", { class: "muted" }, "None yet."));
}
function logPanel(id) {
  const pre = el("pre", { id: "log" });
  const follow = el("input", { type: "checkbox", checked: true, id: "follow" });
  const state = { attempt: null, offset: null };
  const poll = async (job) => {
    if (!follow.checked && state.offset !== null) return;
    if (state.attempt !== job.current_attempt) { state.attempt = job.current_attempt; state.offset = null; pre.textContent = ""; }
    const query = state.offset === null ? "tail=200" : `offset=${state.offset}`;
    const { body, response } = await api(`/v1/jobs/${id}/logs?attempt=${state.attempt}&${query}`, { raw: true });
    state.offset = Number(response.headers.get("X-Next-Offset") || 0);
    if (body.text) {
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
      pre.textContent = (pre.textContent + body.text).slice(-200000);
      if (atBottom || follow.checked) pre.scrollTop = pre.scrollHeight;
    }
  };
  const node = el("div", { class: "card" }, el("div", { class: "row" }, el("h2", { style: "flex:1" }, "Log (current attempt)"),
    el("label", { class: "small" }, follow, " follow")), pre);
  return { node, poll };
}
function downloadJson(value, name) {
  const url = URL.createObjectURL(new Blob([JSON.stringify(value, null, 2) + "\n"], { type: "application/json" }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// ---------- line chart: every plotted point is a circle carrying its value ----------
function lineChart(id, points, yName) {
  if (!points.length) return el("p", { class: "muted", id }, "No points reported yet.");
  const W = 560, H = 250, L = 58, R = 12, T = 10, B = 34;
  const pw = W - L - R, ph = H - T - B;
  let [x0, x1] = [Math.min(...points.map((p) => p.x)), Math.max(...points.map((p) => p.x))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const [y0, y1] = paddedRange(points.map((p) => p.y));
  const sx = (v) => L + pw * (v - x0) / (x1 - x0);
  const sy = (v) => T + ph * (1 - (v - y0) / (y1 - y0));
  const parts = [];
  for (const v of ticks(y0, y1, 5)) {
    parts.push(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(v), y2: sy(v) }),
      svg("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", "font-size": 11 }, fmtTick(v)));
  }
  for (const v of ticks(x0, x1, 8).filter(Number.isInteger)) {
    parts.push(svg("text", { x: sx(v), y: H - B + 16, "text-anchor": "middle", "font-size": 11 }, String(v)));
  }
  parts.push(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: T + ph }),
    svg("line", { class: "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }),
    svg("text", { x: L + pw / 2, y: H - 4, "text-anchor": "middle", "font-size": 11, fill: "#667085" }, "step"));
  const attempts = [...new Set(points.map((p) => p.attempt))];
  for (const [i, attempt] of attempts.entries()) {
    const own = points.filter((p) => p.attempt === attempt).sort((a, b) => a.x - b.x);
    const colour = ATTEMPT_COLOURS[i % ATTEMPT_COLOURS.length];
    parts.push(svg("polyline", { class: "line", stroke: colour, points: own.map((p) => `${sx(p.x).toFixed(2)},${sy(p.y).toFixed(2)}`).join(" ") }));
    for (const p of own) {
      parts.push(svg("circle", { class: "point", r: 3, fill: colour, cx: sx(p.x).toFixed(2), cy: sy(p.y).toFixed(2),
        "data-step": p.x, "data-value": p.y, "data-attempt": attempt }, svg("title", {}, `attempt ${attempt} step ${p.x}: ${yName} ${fmtTick(p.y)}`)));
    }
  }
  // The scale, so that a reader (or a test) can map any point back to its value.
  return svg("svg", { id, class: "chart", viewBox: `0 0 ${W} ${H}`, width: "100%",
    "data-x0": x0, "data-x1": x1, "data-y0": y0, "data-y1": y1, "data-left": L, "data-top": T,
    "data-width": pw, "data-height": ph }, parts);
}
function paddedRange(values) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; return [lo - d, hi + d]; }
  const pad = (hi - lo) * 0.06;
  return [lo - pad, hi + pad];
}
function ticks(lo, hi, count) {
  const raw = (hi - lo) / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
function fmtTick(v) {
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 10000) return `${(v / 1000).toFixed(0)}k`;
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(2);
  return v.toPrecision(3);
}

// ---------- advisor ----------
async function advisorView() {
  const screen = current();
  const known = await api("/console/api/clusters");
  const cluster = known.find((c) => c.name !== "local") || known[0];
  const spec = el("textarea", { id: "advice-spec", spellcheck: "false" },
    `# an example sized for ${cluster.name} (${cluster.gpu_memory_gib} GiB per GPU)\n` +
    `model: {parameters: ${cluster.gpu_memory_gib >= 40 ? 7000000000 : 350000000}}\n` +
    "training: {sequence_length: 2048, global_batch_size: 64, precision: bf16}\n" +
    `resources: {cluster: ${cluster.name}, nodes: 1, gpus_per_node: ${cluster.gpus_per_node}}\n`);
  const file = el("input", { type: "file", accept: ".yaml,.yml,.json", onchange: async () => { if (file.files[0]) spec.value = await file.files[0].text(); } });
  // A Hugging Face config.json replaces the spec's model (the spec's model.hf_config).
  const hf = el("input", { type: "file", id: "hf-config", accept: ".json", onchange: async () => {
    if (!hf.files[0]) return;
    try {
      const body = await api("/console/api/spec", { method: "POST", text: spec.value });
      body.model = { hf_config: JSON.parse(await hf.files[0].text()) };
      spec.value = `${JSON.stringify(body, null, 2)}\n`;
      await run();
    } catch (e) { fill(out, el("p", { class: "error" }, e.message)); }
  } });
  const out = el("div", { id: "advice" });
  const run = async () => {
    fill(out, el("p", { class: "muted" }, "Asking the advisor…"));
    try {
      const [body, clusters] = await Promise.all([api("/console/api/spec", { method: "POST", text: spec.value }), api("/console/api/clusters")]);
      const advice = await api("/v1/advice", { method: "POST", json: body });
      const cluster = (body.resources && body.resources.cluster) || "local";
      const budget = (clusters.find((c) => c.name === cluster) || {}).budget_bytes;
      fill(out, ...adviceView(advice, budget));
    } catch (e) { fill(out, el("p", { class: "error" }, e.message)); }
  };
  screen.show(el("div", { class: "card" }, el("h1", {}, "Advisor"),
    el("p", { class: "muted" }, "Paste or upload a job spec (YAML or JSON; the model, training and resources parts are enough). Nothing is submitted."),
    spec, el("div", { class: "row" }, el("button", { id: "advise", onclick: run }, "Advise"),
      el("label", { class: "small" }, "spec file ", file), el("label", { class: "small" }, "or a Hugging Face config.json ", hf))), out);
  await run();
}
function adviceView(advice, budget) {
  const plan = advice.plan;
  const same = (c) => JSON.stringify(c) === JSON.stringify(plan);
  const stages = [...new Set(advice.candidates.map((c) => c.zero_stage))].sort();
  // One scale for every stage's chart, so that bars compare across them; when the budget
  // dwarfs every bar (a small model on a big GPU), the scale follows the bars instead.
  const largest = Math.max(...advice.candidates.map((c) => c.per_gpu_bytes.total));
  const top = (budget && budget < 3 * largest ? Math.max(budget, largest) : largest) * 1.04;
  const blocks = stages.map((stage) => {
    const own = advice.candidates.filter((c) => c.zero_stage === stage);
    const front = frontier(own, same);
    const rest = own.filter((c) => !front.includes(c));
    return el("div", { class: "stage", "data-stage": stage },
      el("h2", {}, `ZeRO-${stage}`, el("span", { class: "muted small" }, ` · ${own.length} candidates, ${own.filter((c) => c.fits).length} fit; the frontier (least memory for its cost):`)),
      barChart(front, budget, top, same, `frontier-${stage}`),
      rest.length ? lazyDetails(`Show the other ${rest.length} ZeRO-${stage} candidates`, () => barChart(rest, budget, top, same, `rest-${stage}`)) : null);
  });
  return [
    el("div", { class: "card", id: "advice-plan" }, el("div", { class: "row" }, el("h2", { style: "flex:1" }, "Chosen: ", planLabel(plan)),
      el("button", { class: "secondary", id: "download-ds-config", onclick: () => downloadJson(plan.ds_config, "ds_config.json") }, "Download ds_config.json")),
    el("p", {}, advice.reason), advice.warnings.map((w) => el("p", { class: "warning" }, w))),
    el("div", { class: "card" }, el("div", { class: "legend" }, Object.entries(SEGMENTS).map(([name, colour]) => el("span", {}, el("i", { style: `background:${colour}` }), name)),
      el("span", {}, el("i", { style: "background:#000" }), `budget ${fmtBytes(budget)} per GPU`), el("span", {}, "▶ chosen; faded: does not fit")), blocks),
  ];
}
function frontier(candidates, isPlan) {
  // Pareto front on (memory, cost) among those that fit; the smallest one when none fits.
  const fits = candidates.filter((c) => c.fits);
  const pool = fits.length ? fits : [candidates.reduce((a, b) => (a.per_gpu_bytes.total <= b.per_gpu_bytes.total ? a : b))];
  const front = pool.filter((c) => !pool.some((o) => o !== c && o.per_gpu_bytes.total <= c.per_gpu_bytes.total &&
    o.relative_cost <= c.relative_cost && (o.per_gpu_bytes.total < c.per_gpu_bytes.total || o.relative_cost < c.relative_cost)));
  const plan = candidates.find(isPlan);
  if (plan && !front.includes(plan)) front.push(plan);
  return front.sort((a, b) => a.relative_cost - b.relative_cost || a.per_gpu_bytes.total - b.per_gpu_bytes.total);
}
function lazyDetails(summary, build) {
  const details = el("details", {}, el("summary", {}, summary));
  details.addEventListener("toggle", () => { if (details.open && details.children.length === 1) details.append(build()); });
  return details;
}
function stackOf(c) {
  const b = c.per_gpu_bytes;
  const transient = b.temporaries > b.activations ? ["temporaries", b.temporaries] : ["activations", b.activations];
  return [["params", b.params], ["gradients", b.gradients], ["optimizer", b.optimizer], ["buffers", b.buffers], transient, ["overhead", b.overhead]];
}
function barChart(candidates, budget, top, isPlan, id) {
  // One horizontal bar per candidate, its label beside it: legible however many there are.
  const W = 1180, L = 290, R = 150, lane = 22;
  const x = (v) => L + (W - L - R) * v / top;
  const H = candidates.length * lane + 20;
  const rows = candidates.map((c, i) => {
    const y = 4 + i * lane, chosen = isPlan(c);
    let left = 0;
    const segs = stackOf(c).filter(([, n]) => n > 0).map(([name, n]) => {
      const r = svg("rect", { x: x(left), y, width: Math.max(0.5, x(left + n) - x(left)), height: 16, fill: SEGMENTS[name] }, svg("title", {}, `${name} ${fmtBytes(n)}`));
      left += n;
      return r;
    });
    return svg("g", { class: chosen ? "candidate chosen" : "candidate", opacity: c.fits ? 1 : 0.45, "data-fits": c.fits },
      svg("text", { x: L - 8, y: y + 12, "text-anchor": "end", "font-size": 12, "font-weight": chosen ? 700 : 400 }, `${chosen ? "▶ " : ""}${candidateLabel(c)}`),
      segs, chosen ? svg("rect", { x: L - 1, y: y - 1, width: x(c.per_gpu_bytes.total) - L + 2, height: 18, fill: "none", stroke: "#000", "stroke-width": 2 }) : null,
      svg("text", { x: x(c.per_gpu_bytes.total) + 6, y: y + 12, "font-size": 11, fill: "#667085" }, `${fmtBytes(c.per_gpu_bytes.total)} · ${c.tokens_per_second ? `${(c.tokens_per_second / 1000).toFixed(1)}k tokens/s predicted` : `cost ${c.relative_cost.toFixed(2)}`}`));
  });
  const line = !budget ? [] : budget <= top
    ? [svg("line", { x1: x(budget), x2: x(budget), y1: 0, y2: H - 14, stroke: "#000", "stroke-dasharray": "5 4", class: "budget" }),
      svg("text", { x: x(budget), y: H - 2, "text-anchor": "middle", "font-size": 11 }, `budget ${fmtBytes(budget)}`)]
    : [svg("text", { x: W - 4, y: H - 2, "text-anchor": "end", "font-size": 11 }, `budget ${fmtBytes(budget)}: off this scale →`)];
  return svg("svg", { id, viewBox: `0 0 ${W} ${H}`, width: "100%", class: "bars" }, rows, line);
}
function candidateLabel(c) {
  const offload = c.offload_param === "cpu" ? " +offload(opt+params)" : c.offload_optimizer === "cpu" ? " +offload(opt)" : "";
  return `ZeRO-${c.zero_stage}${offload}${c.activation_checkpointing ? " +ckpt" : ""} mb=${c.micro_batch_size}×${c.gradient_accumulation_steps}`;
}

// ---------- calibration: the advisor's predictions against what runs measured ----------
const pct = (v) => (v === null || v === undefined ? "—" : `${v >= 0 ? "+" : "−"}${Math.abs(v * 100).toFixed(1)}%`);
const fmtMs = (s) => (s === null || s === undefined ? "—" : `${(s * 1000).toFixed(1)} ms`);
async function calibrationView() {
  const screen = current();
  const clusters = await api("/console/api/calibration");
  screen.show(el("div", { class: "card" }, el("h1", {}, "Calibration"),
    el("p", { class: "muted" }, "Each observed run's step time and memory peak: measured (x) against the advisor's prediction (y) with this cluster's calibrated constants (filled), and as its plan said when it was made (hollow, joined to it). On the diagonal the prediction is exact; the dashed lines are the fit's typical error (docs/advisor.md).")),
  clusters.map(clusterCalibration));
}
function calibrationSummary(c) {
  const state = c.frozen ? " (frozen)" : "";
  if (!c.observations) return `The advisor's own constants${state}: not calibrated here yet.`;
  const source = c.imported_from ? `, imported from cluster ${c.imported_from} until its own runs refit` : "";
  return `Calibrated on ${c.observations} run${c.observations === 1 ? "" : "s"}${source}${state}, typical step-time error ${(c.typical_error * 100).toFixed(0)}%; memory: ${c.memory_reason}.`;
}
function clusterCalibration(c) {
  const head = el("div", { class: "row" }, el("h2", { style: "flex:1;margin:0" }, `cluster ${c.cluster}`, el("span", { class: "muted small" }, ` · ${c.accelerator}`)));
  if (!c.runs.length) {
    return el("div", { class: "card calibration", "data-cluster": c.cluster }, head, el("p", { class: "summary" }, calibrationSummary(c)),
      el("p", { class: "muted empty" }, "No observed run on this cluster yet: a run is learnt from once it ends with enough steady steps."));
  }
  const steps = c.runs.map((r) => ({ id: r.attempt_id, x: r.measured_step_s, y: r.predicted_step_s, then: r.planned_step_s, learnt: r.learnt, tip: `${r.plan}: measured ${fmtMs(r.measured_step_s)}, predicted ${fmtMs(r.predicted_step_s)} (${pct(r.step_error)}); when planned ${fmtMs(r.planned_step_s)} (${pct(r.planned_step_error)})` }));
  const peaks = c.runs.filter((r) => r.measured_peak_bytes).map((r) => ({ id: r.attempt_id, x: r.measured_peak_bytes, y: r.predicted_peak_bytes, then: r.planned_peak_bytes, learnt: r.learnt, tip: `${r.plan}: needed ${fmtBytes(r.measured_peak_bytes)}, predicted ${fmtBytes(r.predicted_peak_bytes)} (${pct(r.peak_error)})` }));
  const band = c.observations ? c.typical_error : null;
  return el("div", { class: "card calibration", "data-cluster": c.cluster }, head, el("p", { class: "summary" }, calibrationSummary(c)),
    el("div", { class: "grid2 plain" },
      el("div", {}, el("h3", {}, "Step time"), scatterChart(`step-scatter-${c.cluster}`, steps, MS, band)),
      el("div", {}, el("h3", {}, "Memory peak per GPU (per rank on CPU)"), peaks.length ? scatterChart(`peak-scatter-${c.cluster}`, peaks, bytesUnit(peaks), null) : el("p", { class: "muted" }, "No run reported its peak."))),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#2f5fd0" }), "calibrated, learnt from"),
      el("span", {}, el("i", { style: "background:#d9480f" }), "calibrated, newer than the fit"),
      el("span", {}, el("i", { style: "background:#fff;outline:1.5px solid #667085" }), "as planned then")),
    runsTable(c.runs));
}
function runsTable(runs) {
  const head = ["attempt", "plan", "neighbours", "step measured", "predicted", "error", "planned then", "error", "peak needed", "predicted", "error"];
  return lazyDetails(`The ${runs.length} run${runs.length === 1 ? "" : "s"} in numbers`, () => el("table", { class: "runs" },
    el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
    el("tbody", {}, runs.map((r) => el("tr", { "data-attempt": r.attempt_id },
      el("td", {}, el("a", { href: `#/jobs/${r.job_id}` }, r.attempt_id), r.learnt ? null : el("div", { class: "muted small" }, "newer than the fit")),
      el("td", { class: "small" }, r.plan), el("td", {}, String(r.neighbours)),
      el("td", {}, fmtMs(r.measured_step_s)), el("td", {}, fmtMs(r.predicted_step_s)), el("td", {}, pct(r.step_error)),
      el("td", {}, fmtMs(r.planned_step_s)), el("td", {}, pct(r.planned_step_error)),
      el("td", {}, fmtBytes(r.measured_peak_bytes)), el("td", {}, fmtBytes(r.predicted_peak_bytes)), el("td", {}, pct(r.peak_error)))))));
}
function scatterChart(id, points, unit, band) {
  // Measured on x, predicted on y, one scale for both, so that the diagonal is "exact".
  const W = 560, H = 420, L = 74, R = 24, T = 12, B = 40;
  const pw = W - L - R, ph = H - T - B;
  const values = points.flatMap((p) => [p.x, p.y, p.then || p.y]);
  const lo = Math.min(...values) * 0.85, hi = Math.max(...values) * 1.08;
  const sx = (v) => L + pw * (v - lo) / (hi - lo), sy = (v) => T + ph * (1 - (v - lo) / (hi - lo));
  const parts = [];
  for (const t of ticks(lo / unit.per, hi / unit.per, 5)) {
    const v = t * unit.per, words = `${+t.toPrecision(4)} ${unit.name}`;
    parts.push(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(v), y2: sy(v) }), svg("line", { class: "grid", x1: sx(v), x2: sx(v), y1: T, y2: T + ph }),
      svg("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", "font-size": 10 }, words),
      svg("text", { x: sx(v), y: T + ph + 14, "text-anchor": "middle", "font-size": 10 }, words));
  }
  parts.push(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: T + ph }), svg("line", { class: "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }),
    svg("line", { class: "diagonal", x1: sx(lo), y1: sy(lo), x2: sx(hi), y2: sy(hi) }),
    svg("text", { x: L + pw / 2, y: H - 4, "text-anchor": "middle", "font-size": 11, fill: "#667085" }, "measured"),
    svg("text", { x: 12, y: T + ph / 2, "text-anchor": "middle", "font-size": 11, fill: "#667085", transform: `rotate(-90 12 ${T + ph / 2})` }, `predicted (above the diagonal: ${unit.above})`));
  if (band) {
    for (const f of [1 + band, 1 - band]) {  // predicted = measured x (1 ± the fit's typical error)
      const x1 = Math.max(lo, lo / f), x2 = Math.min(hi, hi / f);
      parts.push(svg("line", { class: "band", x1: sx(x1), y1: sy(x1 * f), x2: sx(x2), y2: sy(x2 * f) }));
    }
  }
  for (const p of points) {
    if (p.then) {
      parts.push(svg("line", { class: "moved", x1: sx(p.x), y1: sy(p.then), x2: sx(p.x), y2: sy(p.y) }),
        svg("circle", { class: "planned", r: 3.5, cx: sx(p.x).toFixed(2), cy: sy(p.then).toFixed(2), "data-attempt": p.id, "data-measured": p.x, "data-predicted": p.then }));
    }
    parts.push(svg("circle", { class: `point${p.learnt ? "" : " new"}`, r: 4.5, cx: sx(p.x).toFixed(2), cy: sy(p.y).toFixed(2), "data-attempt": p.id, "data-measured": p.x, "data-predicted": p.y },
      svg("title", {}, p.tip)));
  }
  return svg("svg", { id, class: "chart scatter", viewBox: `0 0 ${W} ${H}`, width: "100%", "data-lo": lo, "data-hi": hi,
    "data-left": L, "data-top": T, "data-width": pw, "data-height": ph }, parts);
}
const MS = { per: 0.001, name: "ms", above: "predicted slower" };
function bytesUnit(points) {
  const big = Math.max(...points.map((p) => p.x)) >= 1024 ** 3;
  return { per: big ? 1024 ** 3 : 1024 ** 2, name: big ? "GiB" : "MiB", above: "room to spare" };
}

// ---------- teams and queue ----------
async function teamsView() {
  const screen = current();
  const teams = el("tbody", { id: "teams" });
  const queue = el("tbody", { id: "queue" });
  const timeline = el("div", { id: "timeline" });
  const refresh = async () => {
    const [rows, waiting, plan] = await Promise.all([api("/v1/teams"), api("/console/api/queue"), api("/console/api/timeline")]);
    fill(timeline, ...timelineView(plan));
    fill(teams, ...rows.map((t) => el("tr", { "data-team": t.name }, el("td", {}, el("b", {}, t.name)),
      el("td", {}, quotaBar(t.gpus_held, t.gpu_quota)), el("td", {}, String(t.gpus_borrowed)), el("td", {}, String(t.gpus_lent)),
      el("td", {}, t.gpu_borrow_limit === null ? "none" : String(t.gpu_borrow_limit)),
      el("td", {}, String(t.gpu_share)), el("td", {}, String(t.jobs_waiting)))));
    fill(queue, ...waiting.map((q) => el("tr", { class: "clickable", onclick: () => { location.hash = `#/jobs/${q.id}`; } },
      el("td", {}, String(q.position)), el("td", {}, el("a", { href: `#/jobs/${q.id}` }, q.name)), el("td", {}, q.team), el("td", {}, q.cluster),
      el("td", {}, String(q.gpus)), el("td", {}, String(q.priority)), el("td", { title: fmtTime(q.submitted_at) }, fmtAge(q.submitted_at)), el("td", { class: "small" }, q.why))));
    if (!waiting.length) queue.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "Nothing waits for admission.")));
  };
  screen.show(el("div", { class: "card" }, el("h1", {}, "Teams"), el("p", { class: "muted small" }, me.is_admin ? "Every team (you are an admin)." : "Your team."),
    el("table", {}, el("thead", {}, el("tr", {}, ["team", "GPUs held / quota", "borrowed", "lent", "borrow limit", "fair share", "jobs waiting"].map((h) => el("th", {}, h)))), teams)),
  el("div", { class: "card" }, el("h2", {}, "Timeline, per cluster"),
    el("p", { class: "muted small" }, "Jobs holding GPUs until their predicted end, waiting jobs from their predicted start to their end (docs/scheduling.md); times in UTC. Hover a bar for what its prediction rests on."),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#2f5fd0" }), "holding GPUs"),
      el("span", {}, el("i", { style: "background:#6b5bd2" }), "waiting: predicted start to end"),
      el("span", {}, el("i", { style: "background:#c5c0ef;outline:1px dashed #1d2330" }), "end not known")),
    timeline),
  el("div", { class: "card" }, el("h2", {}, "Queue, in admission order"),
    el("p", { class: "muted small" }, "Higher priority first, then the team holding the fewest GPUs per share, then the oldest."),
    el("table", {}, el("thead", {}, el("tr", {}, ["#", "job", "team", "cluster", "GPUs", "priority", "waiting", "why"].map((h) => el("th", {}, h)))), queue)));
  await refresh();
  screen.every(3000, () => refresh().catch(() => {}));
}
// ---------- timeline: one lane per job, a bar from its start to its predicted end ----------
const TIME_STEPS = [10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function timelineView(plan) {
  if (!plan.clusters.length) return [el("p", { class: "muted" }, "No job holds or waits for GPUs.")];
  return plan.clusters.map((c) => el("div", { class: "timeline", "data-cluster": c.cluster },
    el("h3", {}, `cluster ${c.cluster}`, el("span", { class: "muted small" }, ` · ${c.holding.length} holding GPUs, ${c.waiting.length} waiting`)),
    timelineChart(c, utc(plan.now).getTime())));
}
function timelineChart(cluster, now) {
  const rows = [...cluster.holding.map((b) => ({ ...b, kind: "holding" })), ...cluster.waiting.map((b) => ({ ...b, kind: "waiting" }))];
  const ms = (iso) => (iso ? utc(iso).getTime() : null);
  const known = rows.flatMap((b) => [ms(b.start_at), ms(b.end_at)]).filter((t) => t !== null);
  const t0 = Math.min(now, ...known);
  let t1 = Math.max(now, ...known);
  const open = rows.some((b) => b.start_at && !b.end_at);
  t1 = t1 + Math.max((t1 - t0) * (open ? 0.3 : 0.04), 30000);  // room after the last end (or for an open end)
  const W = 1180, L = 300, R = 16, T = 22, lane = 28, H = T + rows.length * lane + 8;
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const parts = [];
  const step = 1000 * (TIME_STEPS.find((s) => (t1 - t0) / (s * 1000) <= 8) || 86400 * 7);
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    parts.push(svg("line", { class: "grid", x1: x(t), x2: x(t), y1: T - 4, y2: H }),
      svg("text", { x: x(t), y: 12, "text-anchor": "middle", "font-size": 11, fill: "#667085" }, fmtClock(t)));
  }
  rows.forEach((b, i) => {
    const y = T + i * lane, start = ms(b.start_at), end = ms(b.end_at);
    const label = `${b.name} · ${b.team} · ${b.gpus} GPU${b.gpus === 1 ? "" : "s"}`;
    const tip = `${b.name} (${b.status}): ${start ? fmtClock(start) : "start not known"} → ${end ? fmtClock(end) : "end not known"}\n${b.basis}`;
    const lanes = [svg("text", { class: "label", x: L - 8, y: y + 15, "text-anchor": "end", "font-size": 12 }, label)];
    if (start === null && b.kind === "waiting") {
      lanes.push(svg("text", { class: "why", x: L + 4, y: y + 15, "font-size": 12, fill: "#b76e00" }, unknownWhy(b)));
    } else {
      const from = x(start === null ? now : start), to = end === null ? W - R : x(end);
      lanes.push(svg("rect", { class: `bar ${b.kind}${end === null ? " open" : ""}`, x: from, y: y + 3, width: Math.max(2, to - from), height: 18, rx: 3 }, svg("title", {}, tip)));
      const words = end === null ? unknownWhy(b) : `ends ${fmtClock(end)} (${fmtIn(end - now)})`;
      lanes.push(barLabel(words, from, to, end === null, { L, W, R, y }));
    }
    parts.push(svg("g", { class: `lane ${b.kind}`, "data-job": b.id, "data-start": start ?? "", "data-end": end ?? "" }, lanes));
  });
  parts.push(svg("line", { class: "now", x1: x(now), x2: x(now), y1: T - 6, y2: H, "data-at": now }),
    svg("text", { x: x(now) + 3, y: H - 2, "font-size": 11, fill: "#c0362c" }, "now"));
  return svg("svg", { class: "timeline-chart", viewBox: `0 0 ${W} ${H}`, width: "100%", "data-t0": t0, "data-t1": t1,
    "data-left": L, "data-width": W - L - R }, parts);
}
function barLabel(words, from, to, open, { L, W, R, y }) {
  // After the bar where there is room; an open bar's words before it, else inside it.
  const at = { class: "bar-label", y: y + 16, "font-size": 11 };
  if (!open && W - R - to > 150) return svg("text", { ...at, x: to + 6, fill: "#667085" }, words);
  if (open && from - L > 6.2 * words.length) return svg("text", { ...at, x: from - 6, "text-anchor": "end", fill: "#b76e00" }, words);
  return svg("text", { ...at, x: from + 6, fill: open ? "#1d2330" : "#fff" }, words);
}
function unknownWhy(b) {
  if (!b.start_at && b.kind === "waiting") return b.basis.startsWith("not predicted") ? b.basis : `start not known: ${b.basis.replace(/^start not known: /, "")}`;
  return `end not known: ${b.basis.replace(/^.*run: /, "").replace(/^end: /, "")}`;
}
function fmtClock(t) { return new Date(t).toISOString().slice(11, 19); }
function fmtIn(ms) {
  const s = Math.round(Math.abs(ms) / 1000), sign = ms < 0 ? "ago" : "";
  const words = s < 90 ? `${s} s` : s < 5400 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
  return sign ? `${words} ago` : `in ${words}`;
}
function quotaBar(held, quota) {
  const W = 220, fill = quota ? Math.min(1, held / quota) : 0;
  return el("div", { class: "row" }, svg("svg", { width: W, height: 12, viewBox: `0 0 ${W} 12` },
    svg("rect", { class: "bar-bg", width: W, height: 12, rx: 3 }),
    quota ? svg("rect", { width: W * fill, height: 12, rx: 3, fill: fill >= 1 ? "#c0362c" : "#2f5fd0" }) : null),
  el("span", {}, quota ? `${held} / ${quota}` : `${held} (no quota)`));
}

document.getElementById("sign-out").addEventListener("click", signOut);
window.addEventListener("hashchange", route);
route();
