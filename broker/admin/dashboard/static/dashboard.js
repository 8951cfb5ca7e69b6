// fencepost dashboard: polls /api/cluster every second and /api/charts every two, and redraws the page;
// its three actions (retry, requeue dead, purge finished) are confirmed, then sent with the key typed in.
// Every value from the cluster goes into the page as text (textContent), never as HTML.
"use strict";
(function () {
  const POLL_MS = 1000;
  const STATE_ORDER = ["waiting", "delayed", "running", "done", "dead", "cancelled"];
  const RATE_COLUMNS = [["in", "in/s"], ["done", "done/s"], ["dead", "dead/s"]];
  let lastOk = 0;

  const $ = (id) => document.getElementById(id);

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (className) td.className = className;
    return td;
  }

  function row(cells, className) {
    const tr = document.createElement("tr");
    if (className) tr.className = className;
    cells.forEach((c) => tr.appendChild(c));
    return tr;
  }

  function bytes(n) {
    if (typeof n !== "number") return null;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return n.toFixed(i ? 1 : 0) + " " + units[i];
  }

  function position(p) {
    return Array.isArray(p) ? p.join(":") : null;
  }

  function renderLeader(snap) {
    const leader = snap.leader;
    const el = $("leader");
    if (!leader) {
      el.textContent = "none";
      el.dataset.brokerId = "";
      $("leader-detail").textContent = "no broker leads now";
      return;
    }
    el.textContent = "broker " + leader.id;
    el.dataset.brokerId = String(leader.id);
    $("leader-detail").textContent = (leader.address || "") + (leader.reachable ? "" : " (not answering)");
    $("leader-detail").className = leader.reachable ? "muted" : "bad";
  }

  // On a cluster of several shards a broker's role is the shards it leads (`leads`).
  function role(b) {
    const leads = Array.isArray(b.leads) ? b.leads : [];
    const base = leads.length ? "leads shard" + (leads.length > 1 ? "s " : " ") + leads.join(", ") : b.role;
    return base + (b.learner ? " (learner)" : "");
  }

  function renderBrokers(brokers) {
    $("brokers").replaceChildren(...brokers.map((b) => row([
      cell(b.id), cell(b.name), cell(role(b)),
      cell(b.in_sync ? "yes" : "no", b.in_sync ? "good" : "muted"),
      cell(b.lag, "num"), cell(position(b.position)), cell(b.address),
    ], b.leader ? "leader" : "")));
  }

  function shardLeader(s) {
    if (s.leader === null || s.leader === undefined) return cell("none", "bad");
    const td = cell("broker " + s.leader + (s.reachable === false ? " (not answering)" : ""),
      s.reachable === false ? "bad" : "");
    td.dataset.brokerId = String(s.leader);
    return td;
  }

  // A row per shard (none on a cluster of one shard, whose page stays as it was).
  function renderShards(shards) {
    const sharded = shards.length > 0;
    $("shards-section").hidden = !sharded;
    $("brokers-note").hidden = !sharded;
    $("leader-label").textContent = sharded ? "leader of shard 0" : "leader";
    $("epoch-label").textContent = sharded ? "epoch of shard 0" : "epoch";
    $("rates-note").textContent = "Rates are per second over the last 10 s, from the " +
      (sharded ? "counts of every shard's leader, summed." : "leader's counts.");
    $("shards").replaceChildren(...shards.map((s) => row([
      cell(s.shard), shardLeader(s),
      cell(s.preferred_leader, s.leader !== null && s.preferred_leader !== s.leader ? "muted" : ""),
      cell(s.epoch, "num"), cell((s.insync || []).join(", ")), cell(position(s.position)), cell(s.address),
    ])));
  }

  function renderQueues(queues, rates) {
    const names = Object.keys(queues).sort();
    const seen = new Set();
    names.forEach((n) => Object.keys(queues[n]).forEach((s) => seen.add(s)));
    const others = [...seen].filter((s) => !STATE_ORDER.includes(s)).sort();
    const states = STATE_ORDER.filter((s) => seen.has(s)).concat(others);
    const head = document.createElement("tr");
    ["queue", ...states, ...RATE_COLUMNS.map((c) => c[1]), "actions"].forEach((h) => {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    });
    $("queues-head").replaceChildren(head);
    if (!names.length) {
      const td = cell("no queues (or the leader is not answering)", "muted");
      td.colSpan = 2 + states.length + RATE_COLUMNS.length;
      $("queues").replaceChildren(row([td]));
      return;
    }
    $("queues").replaceChildren(...names.map((n) => row([
      cell(n),
      ...states.map((s) => cell(queues[n][s] || 0, "num" + (s === "dead" && queues[n][s] ? " bad" : ""))),
      ...RATE_COLUMNS.map((c) => cell(((rates || {})[n] || {})[c[0]], "num")),
      actionCell(
        actionButton("requeue dead", "requeue-dead", { queue: n },
          "Requeue every dead task of queue " + n + "?"),
        actionButton("purge finished", "purge-finished", { queue: n },
          "Delete every finished task (done, failed, dead, cancelled, expired) of queue " + n + "?"),
      ),
    ])));
  }

  // Actions: a button asks for confirmation; the request carries the key typed on the page.
  let pending = null;

  function actionButton(text, action, body, question) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = text;
    button.className = "action";
    button.dataset.action = action;
    button.addEventListener("click", () => {
      pending = { action: action, body: body };
      $("confirm-text").textContent = question;
      $("confirm-dialog").showModal();
    });
    return button;
  }

  function actionCell(...buttons) {
    const td = document.createElement("td");
    buttons.forEach((b) => td.appendChild(b));
    return td;
  }

  function showOutcome(ok, text) {
    const el = $("action-result");
    el.textContent = text;
    el.className = ok ? "good" : "bad";
    el.dataset.outcome = ok ? "done" : "refused";
  }

  function describe(doc) {
    if (doc.action === "retry") return "task " + doc.task_id + " is " + doc.state + " again";
    if (doc.action === "requeue-dead") return doc.requeued + " dead tasks of " + doc.queue + " requeued";
    return doc.purged + " finished tasks of " + doc.queue + " purged";
  }

  async function confirmed() {
    $("confirm-dialog").close();
    const asked = pending;
    pending = null;
    if (!asked) return;
    const key = $("admin-key").value.trim();
    const headers = { "Content-Type": "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    try {
      const response = await fetch("/api/actions/" + asked.action, {
        method: "POST", headers: headers, body: JSON.stringify(asked.body), cache: "no-store",
      });
      const doc = await response.json();
      if (doc.ok) showOutcome(true, "done: " + describe(doc));
      else showOutcome(false, "refused (" + response.status + " " + doc.error + "): " + doc.message);
    } catch (err) {
      showOutcome(false, "the dashboard did not answer: " + err);
    }
  }

  $("confirm-yes").addEventListener("click", confirmed);
  $("confirm-no").addEventListener("click", () => { pending = null; $("confirm-dialog").close(); });

  function when(ms) {
    return typeof ms === "number" && ms > 0 ? new Date(ms).toLocaleString() : null;
  }

  // rows null: the leader could not list them now; [] : there are none.
  function renderRows(id, rows, columns, toCells, emptyText) {
    if (!rows || !rows.length) {
      const td = cell(rows ? emptyText : "the leader cannot list them now", "muted");
      td.colSpan = columns;
      $(id).replaceChildren(row([td]));
      return;
    }
    $(id).replaceChildren(...rows.map((r) => row(toCells(r))));
  }

  // A task's last progress report (task.progress in its handler): "42% note", "" if none.
  function progressText(p) {
    if (!p) return "";
    return Math.round(p.fraction * 100) + "%" + (p.note ? " " + p.note : "");
  }

  function renderDeadTasks(tasks) {
    renderRows("dead-tasks", tasks, 7, (t) => [
      cell(t.id), cell(t.queue), cell(t.attempts, "num"), cell(when(t.finished_ms)),
      cell(progressText(t.progress)), cell(t.error, "bad"),
      actionCell(actionButton("retry", "retry", { task_id: t.id }, "Retry dead task " + t.id + "?")),
    ], "none");
  }

  function renderWorkers(workers) {
    renderRows("workers", workers, 4, (w) => [
      cell(w.worker), cell((w.queues || []).join(", ")), cell(w.in_hand, "num"), cell(when(w.last_seen_ms)),
    ], "none seen");
  }

  function renderBookies(bookies) {
    $("bookies").replaceChildren(...bookies.map((b) => row([
      cell(b.id), cell(b.address), cell(bytes(b.free_bytes), "num"),
      cell(b.readonly ? "read-only (disk full)" : "writable", b.readonly ? "bad" : "good"),
    ])));
  }

  function renderFailovers(failovers) {
    if (!failovers.length) {
      const li = document.createElement("li");
      li.textContent = "none seen";
      li.className = "muted";
      $("failovers").replaceChildren(li);
      return;
    }
    $("failovers").replaceChildren(...failovers.map((f) => {
      const li = document.createElement("li");
      const shard = f.shard === undefined ? "" : "shard " + f.shard + ", ";
      li.textContent = new Date(f.at * 1000).toLocaleTimeString() + ": broker " + f.leader + " leads " + shard +
        "epoch " + f.epoch + " (after broker " + f.previous + ")";
      return li;
    }));
  }

  function render(snap) {
    $("cluster").textContent = snap.cluster ? "· cluster " + snap.cluster : "";
    const banner = $("error");
    if (snap.error) {
      banner.textContent = "cannot read the cluster: " + snap.error;
      banner.hidden = false;
      return;
    }
    banner.hidden = true;
    renderLeader(snap);
    $("epoch").textContent = snap.epoch === null || snap.epoch === undefined ? "–" : String(snap.epoch);
    const inSync = snap.brokers.filter((b) => b.in_sync).length;
    $("broker-count").textContent = snap.brokers.length + " (" + inSync + ")";
    $("bookie-count").textContent = String(snap.bookies.length);
    $("ledger-count").textContent = snap.ledgers.count + " (" + snap.ledgers.underreplicated + ")";
    renderBrokers(snap.brokers);
    renderShards(snap.shards || []);
    renderQueues(snap.queues, snap.rates);
    renderDeadTasks(snap.dead_tasks);
    renderWorkers(snap.workers);
    renderBookies(snap.bookies);
    renderFailovers(snap.failovers || []);
  }

  function showFreshness() {
    const badge = $("updated");
    const age = (Date.now() - lastOk) / 1000;
    const stale = !lastOk || age > 5;
    badge.textContent = !lastOk ? "connecting…" : stale ? "no update for " + Math.round(age) + " s" : "live";
    badge.className = stale ? "badge stale" : "badge";
  }

  async function poll() {
    try {
      const response = await fetch("/api/cluster", { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      render(await response.json());
      lastOk = Date.now();
    } catch (err) {
      // The dashboard process itself is away: keep the last view, marked stale.
    } finally {
      showFreshness();
      setTimeout(poll, POLL_MS);
    }
  }

  const CHARTS_POLL_MS = 2000;
  const RATE_CHARTS = [["submit", "chart-submit"], ["complete", "chart-complete"], ["dead", "chart-dead"]];

  function leaderMarkers(doc) {
    return doc.leader_changes.map((c) => ({
      t: c.t,
      text: new Date(c.t * 1000).toLocaleTimeString() + ": broker " + c.leader + " leads " +
        (doc.shards > 1 ? "shard " + c.shard + ", " : "") + "epoch " + c.epoch + " (after broker " + c.previous + ")",
    }));
  }

  function drawChart(id, doc, series, unit) {
    FencepostCharts.draw($(id), $(id + "-legend"), {
      times: doc.t, end: doc.t.length ? doc.t[doc.t.length - 1] : Date.now() / 1000, windowS: doc.window_s,
      unit: unit, series: series, markers: leaderMarkers(doc),
    });
  }

  function renderCharts(doc) {
    const perQueue = (table) => doc.queues.map((q) => ({ name: q, values: table[q] }));
    RATE_CHARTS.forEach(([rate, id]) => drawChart(id, doc, perQueue(doc[rate]), "/s"));
    drawChart("chart-depth", doc, perQueue(doc.depth), "");
    drawChart("chart-commit", doc, [
      { name: "p50", values: doc.commit_p50_ms }, { name: "p99", values: doc.commit_p99_ms },
    ], "ms");
    $("leader-changes").textContent = doc.leader_changes.length
      ? "Leader changes in the window (dashed lines): " + leaderMarkers(doc).map((m) => m.text).join("; ")
      : "No leader change in the window.";
  }

  async function pollCharts() {
    try {
      const response = await fetch("/api/charts", { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      renderCharts(await response.json());
    } catch (err) {
      // The dashboard process itself is away: the charts keep their last drawing.
    } finally {
      setTimeout(pollCharts, CHARTS_POLL_MS);
    }
  }

  poll();
  pollCharts();
})();
