// The live engine: one stream of snapshots from /dashboard/events (fetched with
// the bearer key, so the key never goes in a URL), drawn as the page grid, the
// request table, a preemption log and rolling plots.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const WINDOW_S = 300;
  const GAP_S = 3;
  const PLOTS = [
    ["tokens_per_s", "generated tokens/s", (v) => v.toFixed(1)],
    ["batch", "batch size (running)", (v) => v.toFixed(0)],
    ["kv_usage", "KV usage", (v) => (100 * v).toFixed(1) + "%"],
    ["ttft", "TTFT (s, finished requests)", (v) => v.toFixed(3)],
    ["itl", "inter-token latency (s)", (v) => v.toFixed(4)],
  ];
  const COLORS = { ".": "#e6e8eb", c: "#9ecbf0" };
  let points = [];
  let snapshot = null;
  const preempted = new Map();  // request id -> preemptions seen

  function colorOf(id) {
    let h = 0;
    for (let i = 0; i < id.length; i++) h = (h * 31 + id.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ", 62%, 52%)";
  }

  // ------------------------------------------------------------ the grid
  function drawGrid(s) {
    const canvas = $("grid");
    const n = s.grid.length;
    const width = canvas.clientWidth || 640;
    const cell = Math.max(4, Math.min(22, Math.floor(Math.sqrt((width * 260) / Math.max(n, 1)))));
    const cols = Math.max(1, Math.floor(width / cell));
    const rows = Math.ceil(n / cols);
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    const ctx = canvas.getContext("2d");
    const owner = new Array(n + 1);
    for (const r of s.requests) for (const p of r.pages) if (owner[p] === undefined) owner[p] = r.id;
    const counts = { ".": 0, c: 0, u: 0, p: 0 };
    ctx.font = Math.max(7, cell - 8) + "px sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let i = 0; i < n; i++) {
      const page = i + 1;
      const kind = s.grid[i];
      counts[kind]++;
      const x = (i % cols) * cell;
      const y = Math.floor(i / cols) * cell;
      ctx.fillStyle = COLORS[kind] || (owner[page] ? colorOf(owner[page]) : "#888");
      ctx.fillRect(x + 1, y + 1, cell - 2, cell - 2);
      if (kind === "p") {
        ctx.strokeStyle = "#0b4f8a";
        ctx.lineWidth = 2;
        ctx.strokeRect(x + 2, y + 2, cell - 4, cell - 4);
      }
      const ref = s.refs[String(page)];
      if (ref) {
        ctx.fillStyle = "#111";
        if (cell >= 12) ctx.fillText(String(ref), x + cell / 2, y + cell / 2 + 1);
        else ctx.fillRect(x + cell / 2 - 1, y + cell / 2 - 1, 2, 2);
      }
    }
    canvas.dataset.total = n;
    canvas.dataset.free = counts["."];
    canvas.dataset.cached = counts.c;
    canvas.dataset.used = counts.u + counts.p;
    canvas.dataset.shared = Object.keys(s.refs).length;
    canvas.dataset.requests = s.requests.length;
    $("pool-size").textContent = n + " pages of " + s.page_size + " tokens";
  }

  // ------------------------------------------------------------ counters, table, log
  function counter(label, value, id) {
    const d = PJ.el("div", "counter");
    const v = PJ.el("span", "value", value);
    if (id) v.id = id;
    d.appendChild(v);
    d.appendChild(PJ.el("span", "label", label));
    return d;
  }

  function drawCounters(s) {
    const c = s.counts;
    const last = points.length ? points[points.length - 1] : null;
    $("counters").replaceChildren(
      counter("running", c.running, "c-running"), counter("waiting", c.waiting, "c-waiting"),
      counter("pages used", c.used + " / " + c.total, "c-used"), counter("cached", c.cached),
      counter("shared", c.shared), counter("preemptions", c.preemptions, "c-preemptions"),
      counter("tokens/s", last ? last.tokens_per_s.toFixed(1) : "-"),
      counter("steps", c.steps));
  }

  function progress(r) {
    const bar = PJ.el("div", "bar");
    const fill = PJ.el("div", "fill");
    let frac, text;
    if (r.computed_tokens < r.prompt_tokens) {
      frac = r.computed_tokens / r.prompt_tokens;
      text = "prefill " + r.computed_tokens + "/" + r.prompt_tokens;
    } else {
      frac = r.max_tokens ? r.output_tokens / r.max_tokens : 0;
      text = r.output_tokens + (r.max_tokens ? "/" + r.max_tokens : "") + " tokens";
    }
    fill.style.width = Math.min(100, 100 * frac).toFixed(1) + "%";
    bar.appendChild(fill);
    bar.appendChild(PJ.el("span", null, text));
    return bar;
  }

  function drawRequests(s) {
    const body = $("requests").tBodies[0];
    body.replaceChildren();
    for (const r of s.requests) {
      const tr = document.createElement("tr");
      tr.className = r.state;
      const sw = PJ.el("i", "sw");
      sw.style.background = colorOf(r.id);
      const cells = [sw, PJ.el("span", "rid", r.id), PJ.el("span", null, r.state), progress(r),
        PJ.el("span", null, r.pages.length), PJ.el("span", null, r.cached_tokens),
        PJ.el("span", null, r.preemptions)];
      for (const c of cells) { const td = document.createElement("td"); td.appendChild(c); tr.appendChild(td); }
      body.appendChild(tr);
    }
  }

  function logPreemptions(s) {
    for (const r of s.requests) {
      const seen = preempted.get(r.id) || 0;
      if (r.preemptions > seen) {
        const when = new Date(s.time * 1000).toLocaleTimeString();
        const li = PJ.el("li", null, when + "  " + r.id + " preempted (" + r.preemptions +
          (r.preemptions > 1 ? " times" : " time") + "), its pages freed; it waits to recompute");
        $("preemptions").prepend(li);
      }
      preempted.set(r.id, r.preemptions);
    }
    while ($("preemptions").children.length > 50) $("preemptions").lastChild.remove();
  }

  // ------------------------------------------------------------ plots
  function setupPlots() {
    for (const [key, label] of PLOTS) {
      const fig = PJ.el("figure", "plot");
      const cap = PJ.el("figcaption", null, label + " ");
      const v = PJ.el("span", "now");
      v.id = "now-" + key;
      cap.appendChild(v);
      const c = document.createElement("canvas");
      c.id = "plot-" + key;
      c.width = 300;
      c.height = 90;
      fig.appendChild(cap);
      fig.appendChild(c);
      $("plots").appendChild(fig);
    }
  }

  function drawPlots() {
    const now = Date.now() / 1000;
    points = points.filter((p) => p.t > now - WINDOW_S);
    // The x axis spans the kept points (30 s at least, WINDOW_S at most).
    const span = Math.max(30, Math.min(WINDOW_S, points.length ? now - points[0].t : 0));
    for (const [key, , fmt] of PLOTS) {
      const c = $("plot-" + key);
      const ctx = c.getContext("2d");
      ctx.clearRect(0, 0, c.width, c.height);
      const pts = points.filter((p) => p[key] !== null && p[key] !== undefined);
      const max = Math.max(key === "kv_usage" ? 1 : 1e-9, ...pts.map((p) => p[key]));
      ctx.strokeStyle = "#ccc";
      ctx.strokeRect(0.5, 0.5, c.width - 1, c.height - 1);
      ctx.fillStyle = "#666";
      ctx.font = "10px sans-serif";
      ctx.fillText(fmt(max), 4, 11);
      ctx.fillText("-" + Math.round(span) + " s", 4, c.height - 4);
      ctx.strokeStyle = "#1f6feb";
      ctx.lineWidth = 1.5;
      ctx.fillStyle = "#1f6feb";
      ctx.beginPath();
      let prev = null;
      for (const p of pts) {  // a gap (no data: the engine idle, or no viewer) breaks the line
        const x = c.width * (1 - (now - p.t) / span);
        const y = c.height - 4 - (c.height - 18) * (p[key] / max);
        if (prev !== null && p.t - prev < GAP_S) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        ctx.fillRect(x - 1, y - 1, 2, 2);
        prev = p.t;
      }
      ctx.stroke();
      $("now-" + key).textContent = pts.length ? fmt(pts[pts.length - 1][key]) : "";
    }
  }

  // ------------------------------------------------------------ the stream
  function onEvent(ev) {
    if (ev.points.length) {
      points.push(...ev.points);
    } else if (snapshot && snapshot.idle) {
      const c = snapshot.counts;
      points.push({ t: ev.t, tokens_per_s: 0, batch: 0, waiting: 0, kv_usage: c.used / c.total,
                    ttft: null, itl: null });
    }
    if (ev.snapshot) {
      snapshot = ev.snapshot;
      drawGrid(snapshot);
      drawRequests(snapshot);
      logPreemptions(snapshot);
    }
    if (snapshot) drawCounters(snapshot);
    drawPlots();
  }

  async function connect() {
    for (;;) {
      try {
        const r = await PJ.apiFetch("/dashboard/events");
        if (!r.ok) throw new Error(await PJ.errorText(r));
        $("status").textContent = "live";
        document.body.dataset.ready = "1";
        for await (const ev of PJ.sseEvents(r)) onEvent(ev);
        $("status").textContent = "stream ended; reconnecting";
      } catch (e) {
        $("status").textContent = "disconnected (" + e.message + "); retrying";
      }
      await new Promise((res) => setTimeout(res, 1000));
    }
  }

  PJ.forgetKeyButton();
  setupPlots();
  connect();
})();
