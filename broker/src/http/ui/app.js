// quorumq management UI: a client of the management HTTP API (/api), as RabbitMQ's.
// Plain JavaScript, no build step, no libraries. Pages are hash routes with RabbitMQ's
// shapes (#/queues/%2F/NAME); each page builds its forms once and refreshes its data
// every 5 s (RabbitMQ's statistics interval). Credentials (basic auth) live in
// sessionStorage for the tab's life, as RabbitMQ's UI keeps them in its session.
"use strict";
(() => {
  const REFRESH_MS = 5000;
  const HISTORY_POINTS = 120; // 10 minutes of 5 s samples
  const AUTH_KEY = "quorumq.auth";
  const USER_KEY = "quorumq.user";
  const TAGS_KEY = "quorumq.tags";

  // ---------------------------------------------------------------- DOM helpers
  const $ = (sel) => document.querySelector(sel);
  const enc = encodeURIComponent;

  /** Builds an element: h("a", {href: "#/"}, "text", child...). "on*" attributes are
   * listeners, `value`/`checked`/`selected` properties; strings become text nodes, so
   * names from the broker are never parsed as HTML. */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "value" || k === "checked" || k === "selected") el[k] = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    append(el, kids);
    return el;
  }
  function append(el, ...kids) {
    for (const k of kids.flat(Infinity)) {
      if (k === undefined || k === null || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }
  const fill = (el, ...kids) => { el.replaceChildren(); return append(el, kids); };

  let uid = 0;
  const nextId = (p) => `${p || "f"}${++uid}`;

  // ---------------------------------------------------------------- formatting
  const num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString("en-US"));
  const rate = (n) => (n === undefined || n === null ? "" : `${Number(n).toFixed(1)}/s`);
  function bytes(n) {
    if (n === undefined || n === null) return "";
    const u = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
  }
  function duration(ms) {
    let s = Math.floor((ms || 0) / 1000);
    const d = Math.floor(s / 86400); s -= d * 86400;
    const hh = Math.floor(s / 3600); s -= hh * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return d ? `${d}d ${hh}h` : hh ? `${hh}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
  }
  const statRate = (ms, key) => ms && ms[`${key}_details`] ? ms[`${key}_details`].rate : undefined;
  const pill = (text, kind) => h("span", { class: `pill ${kind || ""}` }, text);
  const json = (v) => JSON.stringify(v);
  const exName = (n) => (n === "" ? "(AMQP default)" : n);
  const exPath = (n) => enc(n === "" ? "amq.default" : n);

  // ---------------------------------------------------------------- API client
  class ApiError extends Error {
    constructor(status, reason) { super(reason); this.status = status; }
  }

  /** Calls the management API with the session's credentials; the JSON reply (null for
   * 201/204). Errors: ApiError with RabbitMQ's `reason`; a refused login ends the
   * session. */
  async function api(method, path, body, headers) {
    const r = await fetch(path, {
      method,
      headers: Object.assign(
        { Authorization: sessionStorage.getItem(AUTH_KEY) || "", "Content-Type": "application/json",
          "X-Requested-With": "XMLHttpRequest" },
        headers || {}),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let v = null;
    if (text) { try { v = JSON.parse(text); } catch (_) { v = text; } }
    if (!r.ok) {
      const reason = (v && v.reason) || r.statusText;
      if (r.status === 401 && reason === "Login failed") logout("Login failed");
      throw new ApiError(r.status, reason);
    }
    return v;
  }
  const get = (p) => api("GET", p);

  // ---------------------------------------------------------------- flash messages
  let flashTimer = null;
  function flash(msg, ok) {
    const f = $("#flash");
    f.hidden = false;
    f.className = ok ? "ok" : "error";
    f.textContent = msg;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { f.hidden = true; }, ok ? 4000 : 10000);
  }

  /** Runs a user action: shows its success text or the API's error, then refreshes. */
  async function act(fn, okText) {
    try {
      const v = await fn();
      if (okText) flash(typeof okText === "function" ? okText(v) : okText, true);
      refreshNow();
      return v;
    } catch (e) {
      flash(e instanceof ApiError ? `${e.status}: ${e.message}` : String(e.message || e), false);
      return undefined;
    }
  }

  function parseJsonField(text, what) {
    if (!text || !text.trim()) return {};
    try {
      const v = JSON.parse(text);
      if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not an object");
      return v;
    } catch (e) {
      throw new Error(`${what}: expected a JSON object, e.g. {"x-max-length": 1000}`);
    }
  }

  // ---------------------------------------------------------------- forms and tables
  /** A labelled input for a form grid; returns [label, control]. */
  function field(label, control) {
    if (!control.id) control.id = nextId("f");
    return [h("label", { for: control.id }, label), control];
  }
  const input = (name, attrs) => h("input", Object.assign({ name }, attrs || {}));
  function select(name, options, value) {
    return h("select", { name }, options.map((o) => {
      const [v, t] = Array.isArray(o) ? o : [o, o];
      return h("option", { value: v, selected: v === value }, t);
    }));
  }
  /** A form whose submit (button or Enter; Ctrl+Enter in a textarea) calls
   * onSubmit(values, form). */
  function form(title, fields, submit, onSubmit, attrs) {
    const f = h("form", Object.assign({ class: "box" }, attrs || {}),
      title ? h("h3", {}, title) : null,
      h("div", { class: "grid" }, fields, h("span"),
        h("div", {}, h("button", { type: "submit", class: "primary" }, submit))));
    f.addEventListener("submit", (e) => {
      e.preventDefault();
      const values = {};
      for (const el of f.elements) {
        if (!el.name) continue;
        values[el.name] = el.type === "checkbox" ? el.checked : el.value;
      }
      onSubmit(values, f);
    });
    f.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && e.ctrlKey && e.target.tagName === "TEXTAREA") {
        e.preventDefault();
        f.requestSubmit();
      }
    });
    return f;
  }
  /** A table of `rows`: columns are [title, row => cell, "n" for numbers]. */
  function table(columns, rows, empty) {
    if (!rows.length) return h("p", { class: "muted" }, empty || "None.");
    return h("div", { class: "scroll" }, h("table", {},
      h("thead", {}, h("tr", {}, columns.map(([t, , n]) => h("th", { class: n || "" }, t)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, columns.map(([, f, n]) => h("td", { class: n || "" }, f(r))))))));
  }
  function kv(pairs) {
    return h("table", { class: "kv" }, h("tbody", {},
      pairs.filter(Boolean).map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
  }
  const button = (text, onclick, cls) => h("button", { type: "button", class: cls || "", onclick }, text);

  // ---------------------------------------------------------------- charts
  /** A time series of samples {t: ms, v: {key: number}}, the last HISTORY_POINTS. */
  class History {
    constructor() { this.points = []; }
    add(values) {
      this.points.push({ t: Date.now(), v: values });
      if (this.points.length > HISTORY_POINTS) this.points.shift();
    }
  }
  const COLORS = ["#2d6a4f", "#0969da", "#bf8700", "#cf222e", "#8250df"];
  const SVG = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    for (const k of kids) el.append(k);
    return el;
  }
  /** A line chart of `series` ([key, label]) over the history's span (at least 1 min),
   * with the latest values in the legend. `fmt` formats values. */
  function chart(history, series, fmt) {
    const W = 720, H = 170, L = 56, R = 8, T = 8, B = 20;
    const pts = history.points;
    const now = pts.length ? pts[pts.length - 1].t : Date.now();
    const span = Math.max(60000, pts.length ? now - pts[0].t : 0);
    let max = 0;
    for (const p of pts) for (const [k] of series) max = Math.max(max, p.v[k] || 0);
    max = niceMax(max);
    const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
    const y = (v) => T + (H - T - B) * (1 - v / max);
    const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    for (const f of [0, 0.5, 1]) {
      svg.append(s("line", { x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), stroke: "#d8dee4" }));
      svg.append(s("text", { x: L - 4, y: y(max * f) + 3, "text-anchor": "end" }, fmt(max * f)));
    }
    svg.append(s("text", { x: L, y: H - 4 }, `-${Math.round(span / 1000)}s`));
    svg.append(s("text", { x: W - R, y: H - 4, "text-anchor": "end" }, "now"));
    series.forEach(([k], i) => {
      const d = pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v[k] || 0).toFixed(1)}`).join(" ");
      if (pts.length) svg.append(s("polyline", { points: d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2 }));
    });
    const last = pts.length ? pts[pts.length - 1].v : {};
    const legend = h("div", { class: "legend" }, series.map(([k, label], i) =>
      h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }), `${label} `, h("b", {}, fmt(last[k] || 0)))));
    return h("div", {}, svg, legend);
  }
  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  const fmtCount = (v) => (Number.isInteger(v) ? num(v) : v.toFixed(1));
  const fmtRate = (v) => `${v >= 10 ? Math.round(v) : v.toFixed(1)}/s`;
  const RATE_SERIES = [["publish", "Publish"], ["deliver_get", "Deliver / get"], ["ack", "Ack"], ["redeliver", "Redeliver"]];
  const OVERVIEW_RATE_SERIES = RATE_SERIES.concat([["dead_lettered", "Dead-lettered"]]);
  function rateValues(ms, series) {
    const v = {};
    for (const [k] of series || RATE_SERIES) v[k] = statRate(ms, k) || 0;
    return v;
  }

  // ---------------------------------------------------------------- shared lookups
  async function vhostNames() {
    return (await get("/api/vhosts?columns=name")).map((v) => v.name);
  }
  function vhostSelect(names, value) {
    return select("vhost", names, value || (names.includes("/") ? "/" : names[0]));
  }

  // ---------------------------------------------------------------- pages
  const overviewRates = new History();
  const overviewQueued = new History();

  function overviewPage(main) {
    const totals = h("div", { class: "totals" });
    const rates = h("div");
    const queued = h("div");
    const nodes = h("div");
    const listeners = h("div");
    append(main, h("h1", {}, "Overview"), totals,
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Message rates"), rates),
        h("section", {}, h("h2", {}, "Queued messages"), queued)),
      h("h2", {}, "Nodes"), nodes, h("h2", {}, "Listeners"), listeners);
    return async () => {
      const [o, ns, qs] = await Promise.all([
        get("/api/overview"), get("/api/nodes"), get("/api/queues?columns=leader,members"),
      ]);
      $("#cluster").textContent = `${o.cluster_name} · ${o.node}`;
      const t = o.object_totals, q = o.queue_totals;
      fill(totals, [["Connections", t.connections], ["Channels", t.channels], ["Exchanges", t.exchanges],
        ["Queues", t.queues], ["Consumers", t.consumers], ["Ready", q.messages_ready],
        ["Unacked", q.messages_unacknowledged], ["Total messages", q.messages]].map(([k, v]) =>
        h("div", { "data-total": k }, h("span", { class: "muted" }, k), h("b", {}, num(v)))));
      overviewRates.add(rateValues(o.message_stats, OVERVIEW_RATE_SERIES));
      overviewQueued.add({ ready: q.messages_ready, unacked: q.messages_unacknowledged, total: q.messages });
      fill(rates, chart(overviewRates, OVERVIEW_RATE_SERIES, fmtRate),
        h("p", { class: "muted" }, "Rates through this node (dead-lettered: by the queues it leads), sampled every 5 s."));
      fill(queued, chart(overviewQueued, [["ready", "Ready"], ["unacked", "Unacked"], ["total", "Total"]], fmtCount));
      fill(nodes, nodesTable(ns, qs));
      fill(listeners, table([["Protocol", (l) => l.protocol], ["Node", (l) => l.node],
        ["Address", (l) => l.ip_address], ["Port", (l) => l.port, "n"]], o.listeners));
    };
  }

  function nodesTable(ns, qs) {
    const leaders = {}, members = {};
    for (const q of qs) {
      if (q.leader) leaders[q.leader] = (leaders[q.leader] || 0) + 1;
      for (const m of q.members || []) members[m] = (members[m] || 0) + 1;
    }
    const alarm = (on, text) => (on ? pill(text, "bad") : "");
    return table([
      ["Name", (n) => n.name],
      ["State", (n) => (n.running ? pill("running", "good") : pill("down", "bad"))],
      ["Uptime", (n) => (n.uptime !== undefined ? duration(n.uptime) : "")],
      ["Leaders", (n) => num(leaders[n.name] || 0), "n"],
      ["Members", (n) => num(members[n.name] || 0), "n"],
      ["Memory", (n) => (n.mem_used !== undefined ? `${bytes(n.mem_used)} / ${bytes(n.mem_limit)} limit` : ""), "n"],
      ["Disk free", (n) => (n.disk_free !== undefined ? `${bytes(n.disk_free)} / ${bytes(n.disk_free_limit)} limit` : ""), "n"],
      ["Alarms", (n) => [alarm(n.mem_alarm, "memory"), alarm(n.disk_free_alarm, "disk"),
        !n.mem_alarm && !n.disk_free_alarm ? pill("none", "good") : ""]],
      ["Maintenance", (n) => (n.being_drained ? pill("draining", "bad") : "")],
      ["AMQP", (n) => n.amqp_addr],
      ["Cluster address", (n) => n.cluster_addr],
      ["", (n) => (!n.running ? "" : n.being_drained
        ? button("Revive", () => act(() => api("POST", `/api/nodes/${enc(n.name)}/revive`),
          `Node ${n.name} revived.`))
        : button("Drain", () => confirm(`Drain node ${n.name}? It hands its queue leaderships over and takes no new ones.`) &&
          act(() => api("POST", `/api/nodes/${enc(n.name)}/drain`),
            (r) => `Node ${n.name} drained: ${r.moved} leaderships moved, ${r.kept} kept.`), "danger"))],
    ], ns);
  }

  function nodesPage(main) {
    const list = h("div");
    append(main, h("h1", {}, "Cluster"), list,
      h("p", {},
        button("Rebalance queue leaders", () => act(() => api("POST", "/api/rebalance/queues"),
          "Rebalance started: quorum queue leaders are spread over their members."))),
      h("p", { class: "muted" },
        "Uptime, memory and disk are reported by the node this page talks to. Drain puts a node ",
        "into maintenance mode (as ", h("code", {}, "rabbitmq-upgrade drain"), "); revive ends it."));
    return async () => {
      const [ns, qs] = await Promise.all([get("/api/nodes"), get("/api/queues?columns=leader,members")]);
      fill(list, nodesTable(ns, qs));
    };
  }

  // Queues: a page of the API's pagination (page, page_size, name), so 1,000 queues
  // cost one page of statuses.
  const QUEUE_COLUMNS = "name,vhost,type,leader,members,online,state,messages,messages_ready," +
    "messages_unacknowledged,messages_dlx,messages_delayed,consumers,message_stats";
  const queueState = { filter: "", regex: false, page: 1, pageSize: 100 };

  function queuesPage(main) {
    const st = queueState;
    const summary = h("span", { class: "muted", id: "queue-count" });
    const list = h("div", { id: "queue-list" });
    const filter = input("filter", { id: "queue-filter", type: "search", value: st.filter, placeholder: "name contains" });
    const regex = input("regex", { id: "queue-regex", type: "checkbox", checked: st.regex });
    const size = select("page_size", ["100", "200", "500"], String(st.pageSize));
    size.id = "queue-page-size";
    const prev = button("‹ Prev", () => { st.page = Math.max(1, st.page - 1); refreshNow(); });
    const next = button("Next ›", () => { st.page += 1; refreshNow(); });
    let debounce = null;
    const onFilter = () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => { st.filter = filter.value; st.regex = regex.checked; st.page = 1; refreshNow(); }, 150);
    };
    filter.addEventListener("input", onFilter);
    regex.addEventListener("change", onFilter);
    size.addEventListener("change", () => { st.pageSize = Number(size.value); st.page = 1; refreshNow(); });
    const addForm = h("div");
    append(main, h("h1", {}, "Queues"),
      h("div", { class: "toolbar" },
        h("label", { for: filter.id }, "Filter"), filter,
        h("label", {}, regex, " Regex"),
        h("label", { for: size.id }, "Page size"), size, prev, next, summary),
      list, h("h2", {}, "Add a new queue"), addForm);
    vhostNames().then((names) => fill(addForm, form(null, [
      field("Virtual host", vhostSelect(names)),
      field("Type", select("type", [["quorum", "Quorum"], ["classic", "Classic"]], "quorum")),
      field("Name", input("name", { required: true, id: "new-queue-name" })),
      field("Arguments (JSON)", input("arguments", { placeholder: '{"x-dead-letter-exchange": ""}' })),
    ], "Add queue", (v) => act(() => {
      const args = Object.assign({ "x-queue-type": v.type }, parseJsonField(v.arguments, "Arguments"));
      return api("PUT", `/api/queues/${enc(v.vhost)}/${enc(v.name)}`, { durable: true, auto_delete: false, arguments: args });
    }, `Queue ${v.name} declared.`)))).catch(() => {});
    return async () => {
      const qs = new URLSearchParams({ page: st.page, page_size: st.pageSize, name: st.filter,
        use_regex: st.regex, columns: QUEUE_COLUMNS });
      let r;
      try {
        r = await get(`/api/queues?${qs}`);
      } catch (e) {
        if (e instanceof ApiError && e.status === 400 && st.page > 1) { st.page = 1; return refreshNow(); }
        throw e;
      }
      st.page = Math.min(st.page, Math.max(1, r.page_count));
      prev.disabled = st.page <= 1;
      next.disabled = st.page >= r.page_count;
      summary.textContent = `Page ${r.page} of ${Math.max(1, r.page_count)} · ${num(r.filtered_count)} matching of ${num(r.total_count)} queues`;
      fill(list, queueTable(r.items));
    };
  }

  function queueTable(items) {
    return table([
      ["Virtual host", (q) => q.vhost],
      ["Name", (q) => h("a", { href: `#/queues/${enc(q.vhost)}/${enc(q.name)}`, class: "queue-link" }, q.name)],
      ["Type", (q) => q.type],
      ["Leader", (q) => q.leader || pill("no leader", "bad")],
      ["Online", (q) => h("span", { title: `members: ${(q.members || []).join(", ")}` },
        `${(q.online || []).length}/${(q.members || []).length}`), "n"],
      ["State", (q) => (q.state === "running" ? q.state : pill(q.state, "bad"))],
      ["Ready", (q) => num(q.messages_ready), "n"],
      ["Unacked", (q) => num(q.messages_unacknowledged), "n"],
      ["Total", (q) => num(q.messages), "n"],
      [h("span", { title: "Dead letters held by this source queue until their target confirms (at-least-once)" }, "Held DL"),
        (q) => num(q.messages_dlx), "n"],
      ["Delayed", (q) => num(q.messages_delayed), "n"],
      ["Consumers", (q) => num(q.consumers), "n"],
      ["Incoming", (q) => rate(statRate(q.message_stats, "publish")), "n"],
      ["Deliver", (q) => rate(statRate(q.message_stats, "deliver_get")), "n"],
      ["Ack", (q) => rate(statRate(q.message_stats, "ack")), "n"],
    ], items, "No queues match.");
  }

  function messagesView(msgs) {
    if (!msgs.length) return h("p", { class: "muted", id: "get-result" }, "Queue is empty.");
    return h("div", { id: "get-result" }, msgs.map((m, i) => h("div", { class: "message" },
      h("b", {}, `Message ${i + 1}`),
      kv([
        ["Exchange", exName(m.exchange)], ["Routing key", m.routing_key],
        ["Redelivered", String(m.redelivered)], ["Messages left", num(m.message_count)],
        ["Properties", h("pre", {}, JSON.stringify(m.properties, null, 1))],
        ["Payload", h("div", {}, h("span", { class: "muted" }, `${num(m.payload_bytes)} bytes, encoding ${m.payload_encoding}`),
          h("pre", { class: "payload" }, m.payload))],
      ]))));
  }

  /** A publish form for `exchange` (fixed `routingKey` for a queue's page). */
  function publishForm(vhost, exchange, routingKey) {
    const fields = [];
    if (routingKey === undefined) fields.push(field("Routing key", input("routing_key")));
    fields.push(
      field("Delivery mode", select("delivery_mode", [["2", "2 - Persistent"], ["1", "1 - Non-persistent"]], "2")),
      field("Headers (JSON)", input("headers", { placeholder: '{"x-match": "all"}' })),
      field("Properties (JSON)", input("properties", { placeholder: '{"content_type": "text/plain", "priority": 1}' })),
      field("Payload encoding", select("payload_encoding", [["string", "String (UTF-8)"], ["base64", "Base64"]], "string")),
      field("Payload", h("textarea", { name: "payload", rows: 3 })));
    return form(null, fields, "Publish message", (v) => act(() => {
      const props = parseJsonField(v.properties, "Properties");
      const headers = parseJsonField(v.headers, "Headers");
      if (Object.keys(headers).length) props.headers = headers;
      props.delivery_mode = Number(v.delivery_mode);
      return api("POST", `/api/exchanges/${enc(vhost)}/${exPath(exchange)}/publish`, {
        properties: props, routing_key: routingKey === undefined ? v.routing_key : routingKey,
        payload: v.payload, payload_encoding: v.payload_encoding,
      });
    }, (r) => (r && r.routed ? "Message published." : "Message published, but not routed.")),
    { id: "publish-form" });
  }

  function queuePage(main, vhost, name) {
    const base = `/api/queues/${enc(vhost)}/${enc(name)}`;
    const details = h("div", { id: "queue-details" });
    const rates = h("div"), queued = h("div");
    const consumers = h("div"), bindings = h("div");
    const raftMembers = h("div", { id: "queue-members" });
    const dl = h("div", { id: "dead-letters" });
    const redriveResult = h("div", { id: "redrive-result" });
    const getResult = h("div");
    const rateHist = new History(), queuedHist = new History();
    const loadDeadLetters = async () => {
      try {
        const d = await get(`${base}/dead-letters`);
        const counts = (o) => Object.entries(o || {}).map(([k, v]) => ({ k, v }));
        fill(dl, kv([
          ["Messages", h("span", { id: "dl-messages" }, num(d.messages))],
          ["Oldest / newest death", `${d.oldest_death || "-"} / ${d.newest_death || "-"}`],
          ["Without x-death", num(d.without_death)],
          ["Held as source (at-least-once)", num(d.held && d.held.messages)],
        ]), h("div", { class: "cols" },
          h("div", {}, h("h3", {}, "By reason"), table([["Reason", (r) => r.k], ["Messages", (r) => num(r.v), "n"]],
            counts(d.by_reason), "No dead letters.")),
          h("div", {}, h("h3", {}, "By source queue"), table([["Source queue", (r) => r.k], ["Messages", (r) => num(r.v), "n"]],
            counts(d.by_source_queue), "No dead letters.")),
          h("div", {}, h("h3", {}, "Held, by reason"), table([["Reason", (r) => r.k], ["Messages", (r) => num(r.v), "n"]],
            counts(d.held && d.held.by_reason), "None held."))));
      } catch (e) {
        fill(dl, h("p", { class: "error" }, `Dead-letter summary: ${e.message}`));
      }
    };
    const getMessages = (count, ackmode, encoding, truncate) => act(async () => {
      const body = { count: Number(count), ackmode, encoding };
      if (truncate) body.truncate = Number(truncate);
      fill(getResult, messagesView(await api("POST", `${base}/get`, body)));
    });
    append(main,
      h("h1", {}, "Queue ", h("span", { id: "queue-name" }, name), " ", h("span", { class: "muted" }, `in vhost ${vhost}`)),
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Details"), details),
        h("section", {}, h("h2", {}, "Queued messages"), queued)),
      h("section", {}, h("h2", {}, "Members"), raftMembers),
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Message rates"), rates),
        h("section", {}, h("h2", {}, "Consumers"), consumers)),
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Bindings"), bindings),
        h("section", {}, h("h2", {}, "Add a binding"),
          form(null, [
            field("From exchange", input("source", { required: true })),
            field("Routing key", input("routing_key")),
          ], "Bind", (v) => act(() => api("POST", `/api/bindings/${enc(vhost)}/e/${enc(v.source)}/q/${enc(name)}`,
            { routing_key: v.routing_key, arguments: {} }), "Binding added.")))),
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Publish message"),
          h("p", { class: "muted" }, "Published to the default exchange with this queue's name as routing key."),
          publishForm(vhost, "", name)),
        h("section", {}, h("h2", {}, "Get messages"),
          form(null, [
            field("Ack mode", select("ackmode", [
              ["ack_requeue_true", "Nack message requeue true"],
              ["reject_requeue_true", "Reject requeue true"],
              ["ack_requeue_false", "Automatic ack"],
              ["reject_requeue_false", "Reject requeue false"]], "ack_requeue_true")),
            field("Encoding", select("encoding", [["auto", "Auto string / base64"], ["base64", "base64"]], "auto")),
            field("Messages", input("count", { type: "number", min: 1, value: "1" })),
            field("Truncate (bytes)", input("truncate", { type: "number", min: 1, value: "50000" })),
          ], "Get Message(s)", (v) => getMessages(v.count, v.ackmode, v.encoding, v.truncate), { id: "get-form" }),
          getResult)),
      h("h2", {}, "Dead letters"),
      h("p", { class: "muted" }, "The dead letters this queue holds, by the reason and source queue of their last death. ",
        "Counting reads every message, so it is refreshed on demand."),
      dl,
      h("div", { class: "toolbar" },
        button("Refresh dead-letter counts", loadDeadLetters),
        button("Peek 10 messages", () => getMessages(10, "ack_requeue_true", "auto", 50000))),
      form("Redrive", [
        field("To queue (empty: each message's source)", input("to", { id: "redrive-to" })),
        field("At most (messages)", input("max", { type: "number", min: 1, id: "redrive-max" })),
        field("Rate (messages/s)", input("rate", { type: "number", min: 0, step: "any", id: "redrive-rate" })),
      ], "Redrive messages", (v) => act(async () => {
        const body = {};
        if (v.to) body.to = v.to;
        if (v.max) body.max = Number(v.max);
        if (v.rate) body.rate = Number(v.rate);
        const r = await api("POST", `${base}/redrive`, body);
        fill(redriveResult, h("pre", {}, JSON.stringify(r, null, 1)));
        await loadDeadLetters();
        return r;
      }, (r) => `Redrive done: ${num(r && r.moved)} moved.`), { id: "redrive-form" }),
      redriveResult,
      h("h2", {}, "Purge and delete"),
      h("div", { class: "toolbar" },
        button("Purge Messages", () => confirm(`Purge every message of queue ${name}?`) &&
          act(() => api("DELETE", `${base}/contents`), "Queue purged."), "danger"),
        button("Delete Queue", async () => {
          if (!confirm(`Delete queue ${name}?`)) return;
          stopRefresh();
          try {
            await api("DELETE", base);
            flash(`Queue ${name} deleted.`, true);
            location.hash = "#/queues";
          } catch (e) { flash(`${e.status || ""}: ${e.message}`, false); startRefresh(); }
        }, "danger")));
    loadDeadLetters();
    return async () => {
      const [q, cs, bs, qs] = await Promise.all([
        get(base), get(`/api/consumers/${enc(vhost)}`), get(`${base}/bindings`),
        get(`${base}/quorum-status`).catch((e) => ({ error: e.message })),
      ]);
      fill(raftMembers, qs.error ? h("p", { class: "muted" }, `Raft status: ${qs.error}`) : table([
        ["Node", (m) => `quorumq@${m.node}`],
        ["Raft state", (m) => pill(m.raft_state, m.raft_state === "leader" || m.raft_state === "follower" ? "good" : "bad")],
        ["Online", (m) => String(m.online)],
        ["Term", (m) => (m.term === null ? "" : num(m.term)), "n"],
        ["Last log index", (m) => (m.last_log_index === null ? "" : num(m.last_log_index)), "n"],
        ["Last applied", (m) => (m.last_applied === null ? "" : num(m.last_applied)), "n"],
        ["Match index", (m) => (m.match_index === null ? "" : num(m.match_index)), "n"],
        ["Lag (entries)", (m) => (m.lag === null ? "" : num(m.lag)), "n"],
        ["Last contact", (m) => (m.last_contact_ms === null ? "" : `${num(m.last_contact_ms)} ms`), "n"],
      ], qs.members || [], "No members."));
      const online = new Set(q.online || []);
      fill(details, kv([
        ["Type", q.type], ["State", q.state === "running" ? pill("running", "good") : pill(q.state, "bad")],
        ["Leader", q.leader || pill("no leader", "bad")],
        ["Members", (q.members || []).map((m) => [pill(`${m}${online.has(m) ? "" : " (offline)"}`, online.has(m) ? "good" : "bad"), " "])],
        ["Policy", q.policy || ""],
        ["Effective policy", Object.keys(q.effective_policy_definition || {}).length ? json(q.effective_policy_definition) : ""],
        ["Arguments", json(q.arguments)],
        ["Durable / auto-delete / exclusive", `${q.durable} / ${q.auto_delete} / ${q.exclusive}`],
        ["Consumers", num(q.consumers)],
        ["Messages", h("span", {}, "total ", h("b", { id: "q-messages" }, num(q.messages)), " · ready ",
          h("b", { id: "q-ready" }, num(q.messages_ready)), " · unacked ", h("b", { id: "q-unacked" }, num(q.messages_unacknowledged)),
          " · held dead letters ", h("b", {}, num(q.messages_dlx)), " · delayed ", h("b", {}, num(q.messages_delayed)))],
        q.unreadable_bodies ? ["Unreadable bodies", pill(num(q.unreadable_bodies), "bad")] : null,
      ]));
      rateHist.add(rateValues(q.message_stats));
      queuedHist.add({ ready: q.messages_ready, unacked: q.messages_unacknowledged, dlx: q.messages_dlx, delayed: q.messages_delayed });
      fill(queued, chart(queuedHist, [["ready", "Ready"], ["unacked", "Unacked"], ["dlx", "Held DL"], ["delayed", "Delayed"]], fmtCount));
      fill(rates, chart(rateHist, RATE_SERIES, fmtRate));
      fill(consumers, table([
        ["Channel", (c) => c.channel_details.name], ["Consumer tag", (c) => c.consumer_tag],
        ["Ack required", (c) => String(c.ack_required)], ["Prefetch", (c) => num(c.prefetch_count), "n"],
        ["Active", (c) => String(c.active)],
      ], cs.filter((c) => c.queue && c.queue.name === name), "No consumers."));
      fill(bindings, table([
        ["From", (b) => (b.source === "" ? "(AMQP default)" : h("a", { href: `#/exchanges/${enc(vhost)}/${exPath(b.source)}` }, b.source))],
        ["Routing key", (b) => b.routing_key], ["Arguments", (b) => json(b.arguments)],
        ["", (b) => (b.source === "" ? "" : button("Unbind", () => act(() => api("DELETE",
          `/api/bindings/${enc(vhost)}/e/${enc(b.source)}/q/${enc(name)}/${enc(b.properties_key)}`), "Binding removed.")))],
      ], bs.filter((b) => b.destination_type === "queue" && b.destination === name)));
    };
  }

  function exchangesPage(main) {
    const list = h("div");
    const addForm = h("div");
    append(main, h("h1", {}, "Exchanges"), list, h("h2", {}, "Add a new exchange"), addForm);
    vhostNames().then((names) => fill(addForm, form(null, [
      field("Virtual host", vhostSelect(names)),
      field("Name", input("name", { required: true })),
      field("Type", select("type", ["direct", "fanout", "headers", "topic"], "direct")),
      field("Durable", input("durable", { type: "checkbox", checked: true })),
      field("Auto delete", input("auto_delete", { type: "checkbox" })),
      field("Internal", input("internal", { type: "checkbox" })),
      field("Arguments (JSON)", input("arguments", { placeholder: '{"alternate-exchange": "ae"}' })),
    ], "Add exchange", (v) => act(() => api("PUT", `/api/exchanges/${enc(v.vhost)}/${enc(v.name)}`, {
      type: v.type, durable: v.durable, auto_delete: v.auto_delete, internal: v.internal,
      arguments: parseJsonField(v.arguments, "Arguments"),
    }), `Exchange ${v.name} declared.`)))).catch(() => {});
    return async () => {
      const xs = await get("/api/exchanges");
      fill(list, table([
        ["Virtual host", (x) => x.vhost],
        ["Name", (x) => h("a", { href: `#/exchanges/${enc(x.vhost)}/${exPath(x.name)}` }, exName(x.name))],
        ["Type", (x) => x.type],
        ["Features", (x) => [x.durable ? "D " : "", x.auto_delete ? "AD " : "", x.internal ? "I " : "",
          Object.keys(x.arguments || {}).length ? "Args" : ""].join("")],
        ["Rate in", (x) => rate(statRate(x.message_stats, "publish_in")), "n"],
        ["Rate out", (x) => rate(statRate(x.message_stats, "publish_out")), "n"],
      ], xs));
    };
  }

  function exchangePage(main, vhost, urlName) {
    const name = urlName === "amq.default" ? "" : urlName;
    const base = `/api/exchanges/${enc(vhost)}/${exPath(name)}`;
    const details = h("div"), rates = h("div"), from = h("div"), to = h("div");
    const hist = new History();
    append(main, h("h1", {}, "Exchange ", exName(name), " ", h("span", { class: "muted" }, `in vhost ${vhost}`)),
      details, h("h2", {}, "Message rates"), rates,
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, "Bindings from this exchange"), from,
          name === "" ? h("p", { class: "muted" }, "The default exchange binds every queue by its name.") :
            form("Add binding from this exchange", [
              field("To", select("dest_type", [["q", "Queue"], ["e", "Exchange"]], "q")),
              field("Destination", input("destination", { required: true })),
              field("Routing key", input("routing_key")),
              field("Arguments (JSON)", input("arguments")),
            ], "Bind", (v) => act(() => api("POST", `/api/bindings/${enc(vhost)}/e/${enc(name)}/${v.dest_type}/${enc(v.destination)}`,
              { routing_key: v.routing_key, arguments: parseJsonField(v.arguments, "Arguments") }), "Binding added."))),
        h("section", {}, h("h2", {}, "Bindings to this exchange"), to)),
      h("h2", {}, "Publish message"), publishForm(vhost, name, undefined),
      name === "" || name.startsWith("amq.") ? null : h("div", {}, h("h2", {}, "Delete this exchange"),
        button("Delete", async () => {
          if (!confirm(`Delete exchange ${name}?`)) return;
          stopRefresh();
          try {
            await api("DELETE", base);
            flash(`Exchange ${name} deleted.`, true);
            location.hash = "#/exchanges";
          } catch (e) { flash(`${e.status || ""}: ${e.message}`, false); startRefresh(); }
        }, "danger")));
    return async () => {
      const [x, bs] = await Promise.all([get(base), get(`/api/bindings/${enc(vhost)}`)]);
      fill(details, kv([["Type", x.type], ["Durable", String(x.durable)], ["Auto delete", String(x.auto_delete)],
        ["Internal", String(x.internal)], ["Arguments", json(x.arguments)]]));
      hist.add({ in: statRate(x.message_stats, "publish_in") || 0, out: statRate(x.message_stats, "publish_out") || 0 });
      fill(rates, chart(hist, [["in", "Publish in"], ["out", "Publish out"]], fmtRate));
      const destLink = (b) => h("a", { href: b.destination_type === "queue" ? `#/queues/${enc(vhost)}/${enc(b.destination)}`
        : `#/exchanges/${enc(vhost)}/${exPath(b.destination)}` }, b.destination);
      const unbind = (b) => button("Unbind", () => act(() => api("DELETE", `/api/bindings/${enc(vhost)}/e/${enc(b.source)}/` +
        `${b.destination_type === "queue" ? "q" : "e"}/${enc(b.destination)}/${enc(b.properties_key)}`), "Binding removed."));
      fill(from, table([["To", destLink], ["Type", (b) => b.destination_type], ["Routing key", (b) => b.routing_key],
        ["Arguments", (b) => json(b.arguments)], ["", (b) => (name === "" ? "" : unbind(b))]],
      bs.filter((b) => b.source === name)));
      fill(to, table([["From", (b) => h("a", { href: `#/exchanges/${enc(vhost)}/${exPath(b.source)}` }, b.source)],
        ["Routing key", (b) => b.routing_key], ["", unbind]],
      bs.filter((b) => b.destination_type === "exchange" && b.destination === name)));
    };
  }

  function connectionsPage(main) {
    const list = h("div", { id: "connection-list" });
    append(main, h("h1", {}, "Connections"), list);
    return async () => {
      const cs = await get("/api/connections");
      fill(list, table([
        ["Name", (c) => c.name],
        ["Virtual host", (c) => c.vhost],
        ["User", (c) => c.user],
        ["State", (c) => c.state],
        ["Protocol", (c) => c.protocol],
        ["TLS", (c) => (c.ssl ? "yes" : "no")],
        ["Channels", (c) => num(c.channels), "n"],
        ["Client", (c) => {
          const p = c.client_properties || {};
          return [p.product, p.version].filter(Boolean).join(" ") + (c.user_provided_name ? ` (${c.user_provided_name})` : "");
        }],
        ["Publish", (c) => rate(statRate(c.message_stats, "publish")), "n"],
        ["Deliver", (c) => rate(statRate(c.message_stats, "deliver_get")), "n"],
        ["Connected", (c) => new Date(c.connected_at).toLocaleString()],
        ["", (c) => button("Close", () => confirm(`Close connection ${c.name}?`) &&
          act(() => api("DELETE", `/api/connections/${enc(c.name)}`, undefined, { "X-Reason": "Closed via management UI" }),
            "Connection closed."), "danger")],
      ], cs, "No connections."));
    };
  }

  function channelsPage(main) {
    const list = h("div");
    append(main, h("h1", {}, "Channels"), list);
    return async () => {
      const cs = await get("/api/channels");
      fill(list, table([
        ["Channel", (c) => c.name],
        ["Virtual host", (c) => c.vhost],
        ["User", (c) => c.user],
        ["Mode", (c) => [c.confirm ? "C" : "", c.transactional ? "T" : ""].join(" ")],
        ["State", (c) => c.state],
        ["Prefetch", (c) => num(c.prefetch_count), "n"],
        ["Consumers", (c) => num(c.consumer_count), "n"],
        ["Unacked", (c) => num(c.messages_unacknowledged), "n"],
        ["Unconfirmed", (c) => num(c.messages_unconfirmed), "n"],
        ["Publish", (c) => rate(statRate(c.message_stats, "publish")), "n"],
        ["Deliver", (c) => rate(statRate(c.message_stats, "deliver_get")), "n"],
        ["Ack", (c) => rate(statRate(c.message_stats, "ack")), "n"],
      ], cs, "No channels."));
    };
  }

  function policiesPage(main) {
    const list = h("div", { id: "policy-list" });
    const formBox = h("div");
    let policyForm = null;
    append(main, h("h1", {}, "Policies"), list, h("h2", {}, "Add / update a policy"), formBox);
    vhostNames().then((names) => {
      policyForm = form(null, [
        field("Virtual host", vhostSelect(names)),
        field("Name", input("name", { required: true, id: "policy-name" })),
        field("Pattern", input("pattern", { required: true, id: "policy-pattern", placeholder: "^orders\\." })),
        field("Apply to", select("apply_to", [["all", "Exchanges and queues"], ["queues", "Queues"], ["exchanges", "Exchanges"]], "all")),
        field("Priority", input("priority", { type: "number", value: "0", id: "policy-priority" })),
        field("Definition (JSON)", input("definition", { required: true, id: "policy-definition", placeholder: '{"max-length": 1000}' })),
      ], "Add / update policy", (v) => act(() => api("PUT", `/api/policies/${enc(v.vhost)}/${enc(v.name)}`, {
        pattern: v.pattern, "apply-to": v.apply_to, priority: Number(v.priority || 0),
        definition: parseJsonField(v.definition, "Definition"),
      }), `Policy ${v.name} set.`), { id: "policy-form" });
      fill(formBox, policyForm);
    }).catch(() => {});
    const edit = (p) => {
      if (!policyForm) return;
      const e = policyForm.elements;
      e.vhost.value = p.vhost; e.name.value = p.name; e.pattern.value = p.pattern;
      e.apply_to.value = p["apply-to"]; e.priority.value = p.priority; e.definition.value = json(p.definition);
      e.pattern.focus();
    };
    return async () => {
      const ps = await get("/api/policies");
      fill(list, table([
        ["Virtual host", (p) => p.vhost], ["Name", (p) => p.name], ["Pattern", (p) => p.pattern],
        ["Apply to", (p) => p["apply-to"]], ["Definition", (p) => json(p.definition)],
        ["Priority", (p) => num(p.priority), "n"],
        ["", (p) => [button("Edit", () => edit(p)), " ",
          button("Delete", () => confirm(`Delete policy ${p.name}?`) &&
            act(() => api("DELETE", `/api/policies/${enc(p.vhost)}/${enc(p.name)}`), `Policy ${p.name} deleted.`), "danger")]],
      ], ps, "No policies."));
    };
  }

  function usersPage(main) {
    const list = h("div");
    const userForm = form(null, [
      field("Username", input("name", { required: true, autocomplete: "off" })),
      field("Password", input("password", { type: "password", autocomplete: "new-password" })),
      field("Tags (comma-separated)", input("tags", { placeholder: "administrator, monitoring, policymaker, management" })),
    ], "Add / update user", (v) => act(() => {
      const body = { tags: v.tags };
      if (v.password) body.password = v.password;
      return api("PUT", `/api/users/${enc(v.name)}`, body);
    }, `User ${v.name} saved.`));
    append(main, h("h1", {}, "Users"), list, h("h2", {}, "Add / update a user"),
      h("p", { class: "muted" }, "Leave the password empty to keep an existing user's password."), userForm);
    return async () => {
      const [us, ps] = await Promise.all([get("/api/users"), get("/api/permissions")]);
      fill(list, table([
        ["Name", (u) => u.name],
        ["Tags", (u) => (u.tags || []).join(", ")],
        ["Can access virtual hosts", (u) => ps.filter((p) => p.user === u.name).map((p) => p.vhost).join(", ") || "No access"],
        ["", (u) => [button("Edit", () => {
          const e = userForm.elements;
          e.name.value = u.name; e.password.value = ""; e.tags.value = (u.tags || []).join(", "); e.tags.focus();
        }), " ", button("Delete", () => confirm(`Delete user ${u.name}?`) &&
          act(() => api("DELETE", `/api/users/${enc(u.name)}`), `User ${u.name} deleted.`), "danger")]],
      ], us));
    };
  }

  function vhostsPage(main) {
    const list = h("div"), perms = h("div"), permBox = h("div");
    let permFormKey = "";
    append(main, h("h1", {}, "Virtual hosts"), list,
      form("Add a new virtual host", [
        field("Name", input("name", { required: true })),
        field("Default queue type", select("default_queue_type", [["", "(node default)"], ["quorum", "quorum"], ["classic", "classic"]], "")),
      ], "Add virtual host", (v) => act(() => api("PUT", `/api/vhosts/${enc(v.name)}`,
        v.default_queue_type ? { default_queue_type: v.default_queue_type } : {}), `Virtual host ${v.name} added.`)),
      h("h2", {}, "Permissions"), perms, permBox);
    return async () => {
      // Users and permissions are the administrator's to read (RabbitMQ's rule).
      const admin = isAdmin();
      const [vs, ps, us] = await Promise.all([get("/api/vhosts"),
        admin ? get("/api/permissions") : [], admin ? get("/api/users?columns=name") : []]);
      fill(list, table([
        ["Name", (v) => v.name],
        ["Default queue type", (v) => v.default_queue_type],
        ["Ready", (v) => num(v.messages_ready), "n"],
        ["Unacked", (v) => num(v.messages_unacknowledged), "n"],
        ["Total", (v) => num(v.messages), "n"],
        ["Publish", (v) => rate(statRate(v.message_stats, "publish")), "n"],
        ["Deliver", (v) => rate(statRate(v.message_stats, "deliver_get")), "n"],
        ["Cluster state", (v) => Object.entries(v.cluster_state || {}).map(([n, st]) => [pill(`${n}: ${st}`, st === "running" ? "good" : "bad"), " "])],
        ["", (v) => button("Delete", () => confirm(`Delete virtual host ${v.name} and everything in it?`) &&
          act(() => api("DELETE", `/api/vhosts/${enc(v.name)}`), `Virtual host ${v.name} deleted.`), "danger")],
      ], vs));
      if (!admin) fill(perms, h("p", { class: "muted" }, "Permissions are shown to administrators."));
      else fill(perms, table([
        ["User", (p) => p.user], ["Virtual host", (p) => p.vhost], ["Configure", (p) => p.configure],
        ["Write", (p) => p.write], ["Read", (p) => p.read],
        ["", (p) => button("Clear", () => act(() => api("DELETE", `/api/permissions/${enc(p.vhost)}/${enc(p.user)}`),
          "Permissions cleared."), "danger")],
      ], ps, "No permissions."));
      // Rebuilt only when the users or vhosts change, so typing is not interrupted.
      const key = json([vs.map((v) => v.name), us.map((u) => u.name)]);
      if (key !== permFormKey && admin) {
        permFormKey = key;
        fill(permBox, form("Set permission", [
          field("User", select("user", us.map((u) => u.name))),
          field("Virtual host", vhostSelect(vs.map((v) => v.name))),
          field("Configure regexp", input("configure", { value: ".*" })),
          field("Write regexp", input("write", { value: ".*" })),
          field("Read regexp", input("read", { value: ".*" })),
        ], "Set permission", (v) => act(() => api("PUT", `/api/permissions/${enc(v.vhost)}/${enc(v.user)}`,
          { configure: v.configure, write: v.write, read: v.read }), "Permissions set.")));
      }
    };
  }

  function notFound(main) {
    append(main, h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/" }, "Overview")));
    return async () => {};
  }

  // ---------------------------------------------------------------- router
  const ROUTES = [
    [/^#?\/?$/, overviewPage, "#/"],
    [/^#\/queues$/, queuesPage, "#/queues"],
    [/^#\/queues\/([^/]+)\/([^/]+)$/, queuePage, "#/queues"],
    [/^#\/exchanges$/, exchangesPage, "#/exchanges"],
    [/^#\/exchanges\/([^/]+)\/([^/]+)$/, exchangePage, "#/exchanges"],
    [/^#\/connections$/, connectionsPage, "#/connections"],
    [/^#\/channels$/, channelsPage, "#/channels"],
    [/^#\/nodes(\/[^/]*)?$/, nodesPage, "#/nodes"],
    [/^#\/policies$/, policiesPage, "#/policies"],
    [/^#\/users$/, usersPage, "#/users"],
    [/^#\/vhosts$/, vhostsPage, "#/vhosts"],
  ];
  let generation = 0;
  let refresher = null;
  let timer = null;
  let busy = false;

  function stopRefresh() { clearInterval(timer); timer = null; refresher = null; }
  function startRefresh() { clearInterval(timer); timer = setInterval(tick, REFRESH_MS); }

  async function tick() {
    const gen = generation, refresh = refresher;
    if (!refresh || busy) return;
    busy = true;
    try {
      await refresh();
      if (gen === generation) {
        $("#refreshed").textContent = `Refreshed ${new Date().toLocaleTimeString()}`;
        document.body.dataset.refreshed = String(Date.now());
      }
    } catch (e) {
      if (gen === generation && sessionStorage.getItem(AUTH_KEY)) flash(`${e.status || ""} ${e.message}`, false);
    } finally {
      busy = false;
    }
  }
  function refreshNow() { busy = false; return tick(); }

  function route() {
    if (!sessionStorage.getItem(AUTH_KEY)) return;
    generation++;
    stopRefresh();
    delete document.body.dataset.refreshed;
    const hash = location.hash || "#/";
    let page = notFound, args = [], nav = "";
    for (const [re, p, n] of ROUTES) {
      const m = hash.match(re);
      if (m) {
        page = p; nav = n;
        try { args = m.slice(1).filter((a) => a !== undefined).map(decodeURIComponent); } catch (_) { page = notFound; }
        break;
      }
    }
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === nav);
    const main = $("#main");
    main.replaceChildren();
    refresher = page(main, ...args);
    document.title = `quorumq: ${(main.querySelector("h1") || {}).textContent || "management"}`;
    refreshNow();
    startRefresh();
  }

  // ---------------------------------------------------------------- login
  const isAdmin = () => (sessionStorage.getItem(TAGS_KEY) || "").split(",").includes("administrator");

  function showApp(user) {
    // Users are the administrator's page (others get 401 Not administrator user).
    $("nav a[href='#/users']").hidden = !isAdmin();
    $("#login").hidden = true;
    $("#app").hidden = false;
    $("#user").textContent = user;
    route();
  }

  function logout(why) {
    sessionStorage.removeItem(AUTH_KEY);
    sessionStorage.removeItem(USER_KEY);
    sessionStorage.removeItem(TAGS_KEY);
    generation++;
    stopRefresh();
    $("#main").replaceChildren();
    $("#app").hidden = true;
    $("#login").hidden = false;
    const err = $("#login-error");
    err.hidden = !why;
    err.textContent = why || "";
    $("#password").value = "";
    $("#username").focus();
  }

  async function login(e) {
    e.preventDefault();
    const user = $("#username").value, pass = $("#password").value;
    const auth = `Basic ${btoa(unescape(encodeURIComponent(`${user}:${pass}`)))}`;
    const err = $("#login-error");
    err.hidden = true;
    try {
      // X-Requested-With: the 401 of a wrong password then carries no WWW-Authenticate,
      // which would open the browser's own login dialog.
      const r = await fetch("/api/whoami", { headers: { Authorization: auth, "X-Requested-With": "XMLHttpRequest" } });
      const v = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(v.reason === "Not management user"
        ? "Not management user: log in with a user tagged administrator, monitoring, policymaker or management."
        : (v.reason || r.statusText));
      sessionStorage.setItem(AUTH_KEY, auth);
      sessionStorage.setItem(USER_KEY, v.name);
      sessionStorage.setItem(TAGS_KEY, (v.tags || []).join(","));
      $("#password").value = "";
      showApp(v.name);
    } catch (ex) {
      err.textContent = ex.message === "Login failed" ? "Login failed: wrong username or password." : ex.message;
      err.hidden = false;
    }
  }

  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", () => logout(""));
  window.addEventListener("hashchange", route);
  if (sessionStorage.getItem(AUTH_KEY)) showApp(sessionStorage.getItem(USER_KEY) || "");
  else logout("");
})();
