// corl live dashboard: polls GET v1/runs/<run>/dashboard and redraws the tables and uPlot charts.
(function () {
  "use strict";
  const RUN = window.CORL_RUN;
  const URL_ = "v1/runs/" + encodeURIComponent(RUN) + "/dashboard";
  const POLL_MS = 2000;
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const UNIT = [0, 1];
  const CHARTS = [
    { key: "mean_reward", title: "mean reward", range: UNIT },
    { key: "label_rate", title: "labelled fraction", range: UNIT },
    { key: "distinct_answers", title: "distinct answers per G samples", range: null },
    { key: "pseudo_label_accuracy", title: "pseudo-label accuracy (diagnostic)", range: UNIT },
  ];
  const plots = {};
  let plotMembers = "";

  const fmt = (v, d) => (v === null || v === undefined ? "–" : Number(v).toFixed(d === undefined ? 3 : d));
  const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };

  function series(view, names, key) {
    const rounds = view.rounds.map((r) => r.round);
    const ys = names.map((n) => view.rounds.map((r) => (r.members[n] ? r.members[n][key] : null)));
    return [rounds, ...ys];
  }

  function diversity(view) {
    return [view.rounds.map((r) => r.round), view.rounds.map((r) => r.cohort_diversity)];
  }

  function makePlot(title, labels, data, range) {
    const box = document.createElement("div");
    box.className = "chart";
    const h = document.createElement("h3");
    h.textContent = title;
    box.appendChild(h);
    document.getElementById("charts").appendChild(box);
    const opts = {
      width: Math.max(320, box.clientWidth - 14), height: 220,
      scales: { x: { time: false }, y: range ? { range: range } : {} },
      axes: [{ label: "round" }, {}],
      series: [{ label: "round" }, ...labels.map((l, i) => ({ label: l, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true }))],
    };
    return new uPlot(opts, data, box);
  }

  function drawCharts(view) {
    const names = view.members.map((m) => m.name);
    if (names.join(",") !== plotMembers) {
      document.getElementById("charts").replaceChildren();
      for (const k in plots) delete plots[k];
      for (const c of CHARTS) plots[c.key] = makePlot(c.title, names, series(view, names, c.key), c.range);
      plots.diversity = makePlot("cohort diversity (distinct pseudo-labels / members)", ["cohort"], diversity(view), UNIT);
      plotMembers = names.join(",");
      return;
    }
    for (const c of CHARTS) plots[c.key].setData(series(view, names, c.key));
    plots.diversity.setData(diversity(view));
  }

  function drawTables(view) {
    const body = document.querySelector("#members tbody");
    body.replaceChildren(...view.members.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.member = m.name;
      const version = m.endpoint ? "endpoint" : m.weight_version === null ? "down" : "v" + m.weight_version;
      const weights = m.weight_transfer ? version + " (" + m.weight_transfer + ")" : version;
      tr.append(
        cell(m.name), cell(m.role), cell(weights),
        cell(fmt(m.mean_reward)), cell(fmt(m.label_rate, 2)), cell(fmt(m.distinct_answers, 2)),
        cell(fmt(m.pseudo_label_accuracy, 2)), cell(fmt(m.label_share, 2)),
        cell(m.heldout_accuracy === null ? "–" : fmt(m.heldout_accuracy, 3) + " (v" + m.heldout_version + ")"),
        cell(m.backlog === null ? "–" : String(m.backlog)),
        cell(m.collapse ? "ALARM" : "ok", m.collapse ? "alarm" : ""),
      );
      return tr;
    }));
    const outside = view.members.filter((m) => m.endpoint);
    document.getElementById("endpoints-section").hidden = outside.length === 0;
    document.querySelector("#endpoints tbody").replaceChildren(...outside.map((m) => {
      const e = m.endpoint;
      const tr = document.createElement("tr");
      tr.dataset.member = m.name;
      const n = e.n_per_request === null ? "–" : e.n_per_request ? "yes" : "no";
      const v = e.verdicts;
      tr.append(
        cell(m.name), cell(e.model), cell(e.api), cell(String(e.requests)), cell(String(e.retries)),
        cell(String(e.rate_limited)), cell(String(e.failed_calls), e.failed_calls ? "alarm" : ""),
        cell(e.no_answer_samples + " / " + e.samples), cell(String(e.prompt_tokens)), cell(String(e.completion_tokens)),
        cell(e.mean_latency_s === null ? "–" : fmt(e.mean_latency_s, 2) + " s"), cell(n),
        cell(v.logprobs + " / " + v.text + " / " + v.unread), cell(e.last_error || "–"),
      );
      return tr;
    }));
    const graders = document.querySelector("#graders tbody");
    graders.replaceChildren(...Object.entries(view.grader_weights).map(([g, w]) => {
      const tr = document.createElement("tr");
      const q = view.quarantined.includes(g);
      tr.append(cell(g), cell(fmt(w)), cell(q ? "quarantined" : "active", q ? "alarm" : ""));
      return tr;
    }));
    const alarms = document.getElementById("alarms");
    const lines = [];
    if (view.collapse.length) lines.push("collapse alarm: " + view.collapse.join(", "));
    if (view.quarantined.length) lines.push("quarantined graders: " + view.quarantined.join(", "));
    alarms.textContent = lines.join(" · ");
    alarms.hidden = lines.length === 0;
  }

  async function poll() {
    try {
      const resp = await fetch(URL_, { cache: "no-store" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const view = await resp.json();
      document.getElementById("run").textContent = view.run_id;
      document.getElementById("summary").textContent =
        "round " + view.next_round + " · " + view.members.length + " members · updated " +
        new Date(view.updated_at * 1000).toLocaleTimeString();
      drawTables(view);
      drawCharts(view);
      document.body.dataset.status = "live";
      document.body.dataset.rounds = String(view.rounds.length);
    } catch (err) {
      document.body.dataset.status = "error";
      document.getElementById("summary").textContent = "cannot reach the aggregator: " + err.message;
    }
    setTimeout(poll, POLL_MS);
  }

  window.addEventListener("resize", () => {
    for (const k in plots) {
      const box = plots[k].root.parentNode;
      plots[k].setSize({ width: Math.max(320, box.clientWidth - 14), height: 220 });
    }
  });

  poll();
})();
