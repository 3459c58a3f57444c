// arbiter dashboard. The server renders every panel; this script keeps the
// page live: it follows the event stream (/ui/events), asks the server for
// the panels an event concerns (/ui/panels), puts them in place without
// moving what did not change, keeps relative times current, sends the
// actions (release, drain, undrain, swap …) with fetch, and streams the log
// of one swap (/api/v1/swaps/{id}/stream). No framework, no build step.
"use strict";

(function () {
  const body = document.body;
  let skew = Date.parse(body.dataset.now) - Date.now(); // server clock − ours
  let lastSeq = body.dataset.seq || "0";
  const conn = document.getElementById("conn");
  const dirty = new Set();
  let inflight = false;
  let timer = 0;
  let spacing = 250; // between refreshes: four times the last one's duration, 250 ms to 5 s
  let lastEnd = -Infinity;
  let stream = null;
  let failures = 0;

  // ---- relative times ------------------------------------------------------

  // ago says how long before now t was, with the server's rule (ui/render.go).
  function ago(ms) {
    if (ms > -1000 && ms < 5000) return "just now"; // under a second ahead: clocks and rounding, not a future
    const future = ms < 0;
    let d = Math.floor(Math.abs(ms) / 1000);
    let s;
    if (d < 60) s = d + " s";
    else if (d < 3600) s = Math.floor(d / 60) + " min";
    else if (d < 48 * 3600) s = Math.floor(d / 3600) + " h";
    else s = Math.floor(d / 86400) + " d";
    return future ? "in " + s : s + " ago";
  }

  const absFormat = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

  function relabel(root) {
    const now = Date.now() + skew;
    for (const el of (root || document).querySelectorAll("time[data-rel]")) {
      const t = Date.parse(el.getAttribute("datetime"));
      if (isNaN(t)) continue;
      const text = ago(now - t);
      if (el.textContent !== text) el.textContent = text;
      if (!el.dataset.local) {
        el.title = absFormat.format(new Date(t)) + (el.title.includes(" · ") ? el.title.slice(el.title.indexOf(" · ")) : "");
        el.dataset.local = "1";
      }
      const interval = parseFloat(el.dataset.interval);
      if (interval > 0) {
        // Late: three quarters of the keepalive interval gone without a sign of life.
        el.classList.toggle("late", now - t > interval * 750);
      }
    }
  }

  // ---- putting new HTML in place -------------------------------------------

  // morph makes the children of `to` the children of `from`, reusing the
  // nodes that are already there (matched by id, else by position and tag),
  // so focus, scroll and layout stay where they were.
  function morphChildren(from, to) {
    const byId = new Map();
    for (const c of from.children) if (c.id) byId.set(c.id, c);
    let cur = from.firstChild;
    for (const n of Array.from(to.childNodes)) {
      let match = null;
      if (n.nodeType === 1 && n.id && byId.has(n.id)) {
        match = byId.get(n.id);
      } else if (cur && cur.nodeType === n.nodeType && (n.nodeType !== 1 ||
          (cur.tagName === n.tagName && !(cur.id && cur.id !== n.id)))) {
        match = cur;
      }
      if (!match) {
        from.insertBefore(n, cur);
        continue;
      }
      if (match === cur) cur = cur.nextSibling;
      else from.insertBefore(match, cur);
      if (n.nodeType === 1) morphElement(match, n);
      else if (match.nodeValue !== n.nodeValue) match.nodeValue = n.nodeValue;
    }
    while (cur) {
      const next = cur.nextSibling;
      from.removeChild(cur);
      cur = next;
    }
  }

  function morphElement(from, to) {
    for (const a of Array.from(from.attributes)) {
      if (!to.hasAttribute(a.name) && a.name !== "data-local" && a.name !== "disabled") from.removeAttribute(a.name);
    }
    for (const a of to.attributes) {
      if (a.name === "title" && from.dataset.local && from.tagName === "TIME") continue;
      if (from.getAttribute(a.name) !== a.value) {
        from.setAttribute(a.name, a.value);
        if (a.name === "datetime") delete from.dataset.local;
      }
    }
    // data-keep: what is inside belongs to this script (a swap's log, an
    // error message), not to the server's rendering.
    if (!from.hasAttribute("data-keep")) morphChildren(from, to);
  }

  function place(name, show, html) {
    const section = document.getElementById("p-" + name);
    if (!section) return;
    section.hidden = !show;
    if (!show) return;
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    morphChildren(section, tpl.content);
    if (name === "services") syncSwapLog();
    staleTimers(section);
  }

  // staleTimers: a panel may say when it goes stale without an event (a
  // grid machine's boards freed after the settling time): refresh then.
  const staleAt = new Set();
  function staleTimers(root) {
    for (const el of root.querySelectorAll("[data-stale-at]")) {
      const at = el.dataset.staleAt;
      const t = Date.parse(at);
      if (isNaN(t) || staleAt.has(at)) continue;
      staleAt.add(at);
      setTimeout(() => {
        staleAt.delete(at);
        markFor("machine.");
        schedule(0);
      }, Math.max(0, t - (Date.now() + skew)) + 300);
    }
  }

  // ---- refreshing panels after events --------------------------------------

  function markFor(kind) {
    for (const s of document.querySelectorAll("section.panel[data-kinds]")) {
      for (const p of s.dataset.kinds.split(" ")) {
        if (kind.startsWith(p)) {
          dirty.add(s.id.slice(2));
          break;
        }
      }
    }
  }

  function markAll() {
    for (const s of document.querySelectorAll("section.panel")) dirty.add(s.id.slice(2));
  }

  function schedule(delay) {
    if (timer || inflight || dirty.size === 0 || document.hidden) return;
    timer = setTimeout(refresh, Math.max(delay, lastEnd + spacing - performance.now()));
  }

  async function refresh() {
    timer = 0;
    if (dirty.size === 0) return;
    const names = Array.from(dirty);
    dirty.clear();
    inflight = true;
    const started = performance.now();
    try {
      const q = names.map((n) => "p=" + encodeURIComponent(n)).join("&");
      const resp = await fetch("/ui/panels?" + q, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (resp.status === 401) {
        location.reload(); // the token was withdrawn: show the sign-in form
        return;
      }
      if (!resp.ok) throw new Error(await errorText(resp));
      const out = await resp.json();
      skew = Date.parse(out.now) - Date.now();
      for (const p of out.panels) place(p.name, p.show, p.html);
      relabel();
    } catch (e) {
      for (const n of names) dirty.add(n);
      setConn("error", "update failed: " + e.message);
    } finally {
      inflight = false;
      // A busy server (many events, a large fleet) is asked less often.
      lastEnd = performance.now();
      spacing = Math.min(5000, Math.max(250, 4 * (lastEnd - started)));
      schedule(0);
    }
  }

  // ---- the event stream ----------------------------------------------------

  function setConn(state, text) {
    conn.dataset.state = state;
    conn.querySelector(".conn-text").textContent = text;
  }

  function connect() {
    stream = new EventSource("/ui/events?since=" + encodeURIComponent(lastSeq));
    stream.onopen = () => {
      setConn("live", "live");
      if (failures > 0) {
        // Back after a break: the replayed events refresh what changed, but
        // say so at once rather than wait for them.
        markAll();
        schedule(0);
      }
      failures = 0;
    };
    stream.onmessage = (m) => {
      if (m.lastEventId) lastSeq = m.lastEventId;
      let ev;
      try {
        ev = JSON.parse(m.data);
      } catch (e) {
        return;
      }
      markFor(ev.kind || "");
      schedule(100);
    };
    stream.addEventListener("live", (m) => {
      let d;
      try {
        d = JSON.parse(m.data);
      } catch (e) {
        return;
      }
      skew = Date.parse(d.now) - Date.now();
      for (const [id, t] of Object.entries(d.ka || {})) {
        for (const el of document.querySelectorAll('time[data-ka="' + CSS.escape(id) + '"]')) retime(el, t);
      }
      for (const [name, t] of Object.entries(d.seen || {})) {
        for (const el of document.querySelectorAll('time[data-seen="' + CSS.escape(name) + '"]')) retime(el, t);
      }
      relabel();
    });
    // Something without events of its own changed (the webhook delivery log).
    stream.addEventListener("stale", (m) => {
      let d;
      try {
        d = JSON.parse(m.data);
      } catch (e) {
        return;
      }
      for (const n of d.panels || []) if (document.getElementById("p-" + n)) dirty.add(n);
      schedule(100);
    });
    stream.onerror = () => {
      failures++;
      setConn("down", "reconnecting…");
      if (stream.readyState === EventSource.CLOSED) {
        // The browser gave up (an error answer rather than a dropped
        // connection): find out why, then try again from the last event.
        stream.close();
        fetch("/api/v1/whoami", { credentials: "same-origin" }).then((r) => {
          if (r.status === 401) location.reload();
        }, () => {});
        setTimeout(connect, Math.min(30000, 1000 * 2 ** Math.min(failures, 5)));
      }
    };
  }

  function retime(el, t) {
    if (el.getAttribute("datetime") !== t) {
      el.setAttribute("datetime", t);
      delete el.dataset.local;
    }
  }

  // ---- actions -------------------------------------------------------------

  const dialog = document.getElementById("confirm");
  let pending = null;

  document.addEventListener("click", (e) => {
    const board = e.target.closest(".boardmap .gboard");
    if (board) {
      // A phone has no hover: a tap shows the board's details under the map.
      const info = board.closest(".boardmap").querySelector(".board-info");
      if (info) info.textContent = board.title.charAt(0).toUpperCase() + board.title.slice(1);
      return;
    }
    const cell = e.target.closest(".cells .cell");
    if (cell) {
      // A large fleet's compact rows: a tap says what the cell's title does.
      toast(cell.closest(".mrow").querySelector(".mrow-name").textContent + " · " + cell.title, false);
      return;
    }
    const b = e.target.closest("button[data-action]");
    if (!b || b.disabled) return;
    if (b.dataset.action === "swap-log") {
      // Only shows: nothing to confirm.
      chosenSwap = b.dataset.swap === defaultSwap() ? "" : b.dataset.swap;
      syncSwapLog();
      document.getElementById("swaplog")?.scrollIntoView({ block: "nearest" });
      return;
    }
    if (b.dataset.action === "swap-follow") {
      chosenSwap = "";
      syncSwapLog();
      return;
    }
    pending = { action: b.dataset.action, id: b.dataset.id, machine: b.dataset.machine, lock: b.dataset.lock, task: b.dataset.task, label: b.textContent.trim() };
    let title = b.dataset.title || pending.label;
    let text = b.dataset.confirm || "";
    if (pending.action === "swap") {
      const form = b.closest(".swap-form");
      const sel = form.querySelector("select");
      const opt = sel.selectedOptions[0];
      const force = form.querySelector('input[name="force"]');
      pending.service = b.dataset.service;
      pending.key = sel.value;
      pending.force = !!(force && force.checked);
      pending.label = "Swap";
      title = "Swap " + pending.service + " to " + pending.key;
      text = (b.dataset.current ? pending.service + " stops serving " + b.dataset.current + " and" : pending.service) +
        " restarts with " + (opt ? opt.dataset.model : pending.key) + "; requests to it fail until the new model is ready." +
        (pending.force ? " You override the lock: its holder may be in the middle of something." : "");
    }
    document.getElementById("confirm-title").textContent = title + "?";
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-ok").textContent = pending.label;
    dialog.returnValue = "";
    dialog.showModal();
  });

  dialog.addEventListener("close", () => {
    const p = pending;
    pending = null;
    if (p && dialog.returnValue === "ok") act(p);
  });

  async function act(p) {
    let url, method, body;
    switch (p.action) {
      case "swap":
        url = "/api/v1/services/" + encodeURIComponent(p.service) + "/swaps" + (p.force ? "?force=true" : "");
        method = "POST";
        body = JSON.stringify({ model_key: p.key });
        return swap(p, url, body);
      case "release":
        url = "/api/v1/allocations/" + encodeURIComponent(p.id);
        method = "DELETE";
        break;
      case "task-cancel":
      case "task-requeue":
        url = "/api/v1/tasks/" + encodeURIComponent(p.task) + "/" + p.action.slice(5);
        method = "POST";
        break;
      case "lock-release":
        url = "/api/v1/locks/" + encodeURIComponent(p.lock) + "?force=true";
        method = "DELETE";
        break;
      case "drain":
      case "undrain":
        url = "/api/v1/machines/" + encodeURIComponent(p.machine) + "/" + p.action;
        method = "POST";
        break;
      default:
        return;
    }
    try {
      const resp = await fetch(url, {
        method,
        credentials: "same-origin",
        headers: { "X-Arbiter-CSRF": "1", Accept: "application/json" },
        body,
      });
      if (!resp.ok) throw new Error(await errorText(resp));
      toast(p.label + " " + (p.id ? "#" + p.id : p.machine || p.lock || "") + ": done", false);
      markAll();
      schedule(0);
    } catch (e) {
      toast(p.label + " failed: " + e.message, true);
    }
  }

  // swap requests a swap and follows its log; a refusal (the lock's 423, a
  // swap already running …) is shown under the service's swap control.
  async function swap(p, url, body) {
    const msg = document.getElementById("swapmsg-" + p.service);
    if (msg) msg.textContent = "";
    try {
      const resp = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-Arbiter-CSRF": "1", Accept: "application/json", "Content-Type": "application/json" },
        body,
      });
      if (!resp.ok) throw new Error(await errorText(resp));
      const sw = await resp.json();
      toast("Swap #" + sw.id + " of " + p.service + " to " + p.key + " asked for", false);
      chosenSwap = String(sw.id);
      markAll();
      schedule(0);
    } catch (e) {
      if (msg) msg.textContent = "Swap refused: " + e.message;
      toast("Swap of " + p.service + " refused: " + e.message, true);
    }
  }

  // ---- a swap's log ---------------------------------------------------------

  let chosenSwap = ""; // the swap the reader picked; "" follows the panel's default
  let logID = "";
  let logSrc = null;
  let logPre = null;
  let logNext = 0; // the number of the next line to show: a reconnected stream starts again from 0
  let logEnd = null; // the swap as the stream's end event told it
  let logLines = [];
  let logTimer = 0;

  function defaultSwap() {
    const box = document.getElementById("swaplog");
    return box ? box.dataset.default : "";
  }

  // syncSwapLog streams the log of the chosen swap, or of the panel's
  // default (the one in progress, else the latest), into #swaplog.
  function syncSwapLog() {
    const box = document.getElementById("swaplog");
    if (!box) {
      closeLog();
      logID = "";
      return;
    }
    // Once the chosen swap is the default (the one just asked for is in
    // progress), follow the default again.
    if (chosenSwap === box.dataset.default) chosenSwap = "";
    const want = chosenSwap || box.dataset.default;
    const pre = box.querySelector("pre");
    if (want !== logID || pre !== logPre) openLog(want, pre);
    logHead(box);
  }

  function closeLog() {
    if (logSrc) logSrc.close();
    logSrc = null;
  }

  function openLog(id, pre) {
    closeLog();
    logID = id;
    logPre = pre;
    logNext = 0;
    logEnd = null;
    logLines = [];
    pre.textContent = "";
    const src = new EventSource("/api/v1/swaps/" + encodeURIComponent(id) + "/stream");
    logSrc = src;
    src.addEventListener("log", (m) => {
      let d;
      try {
        d = JSON.parse(m.data);
      } catch (e) {
        return;
      }
      if (d.n < logNext) return; // already shown before a reconnect
      logNext = d.n + 1;
      logLines.push(d.line);
      if (!logTimer) logTimer = setTimeout(flushLog, 40);
    });
    src.addEventListener("end", (m) => {
      src.close();
      try {
        logEnd = JSON.parse(m.data);
      } catch (e) {
        logEnd = {};
      }
      flushLog();
      const box = document.getElementById("swaplog");
      if (box && logSrc === src) logHead(box);
    });
    src.onerror = () => {
      if (src.readyState === EventSource.CLOSED && logSrc === src && !logEnd) {
        logLines.push("(the log of swap #" + id + " could not be read)");
        flushLog();
      }
    };
  }

  function flushLog() {
    clearTimeout(logTimer);
    logTimer = 0;
    if (!logPre || logLines.length === 0) return;
    const pre = logPre;
    const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.append(logLines.join("\n") + "\n");
    logLines = [];
    if (atEnd) pre.scrollTop = pre.scrollHeight;
    const box = document.getElementById("swaplog");
    if (box) logHead(box);
  }

  // logHead writes the viewer's heading: which swap, its state and size.
  function logHead(box) {
    const head = box.querySelector(".swaplog-head");
    if (!head) return;
    const row = document.getElementById("sw-" + logID);
    const state = (row && row.dataset.state) || (logEnd && logEnd.state) || "";
    const service = (row && row.dataset.service) || (logEnd && logEnd.service) || "";
    const key = (row && row.dataset.key) || (logEnd && logEnd.model_key) || "";
    const h = document.createElement("h3");
    h.className = "sub";
    h.id = "swaplog-title";
    h.textContent = "Log of swap #" + logID + (service ? " · " + service + " → " + key : "");
    const parts = [h];
    if (state) {
      const b = document.createElement("span");
      b.className = "badge badge-" + state;
      b.textContent = state;
      parts.push(b);
    }
    const n = document.createElement("span");
    n.className = "muted swaplog-lines";
    n.textContent = logNext === 1 ? "1 line" : logNext + " lines";
    if (logSrc && !logEnd && (state === "running" || state === "pending")) n.textContent += " · live";
    parts.push(n);
    if (chosenSwap && chosenSwap !== box.dataset.default) {
      const f = document.createElement("button");
      f.type = "button";
      f.className = "act";
      f.dataset.action = "swap-follow";
      f.textContent = "Show swap #" + box.dataset.default;
      parts.push(f);
    }
    head.replaceChildren(...parts);
    for (const r of document.querySelectorAll("tr[data-swap]")) r.classList.toggle("showing", r.dataset.swap === logID);
  }

  async function errorText(resp) {
    try {
      const j = await resp.json();
      if (j && j.error && j.error.message) return j.error.message;
    } catch (e) {
      // not the error format
    }
    return resp.status + " " + resp.statusText;
  }

  const toastEl = document.getElementById("toast");
  let toastTimer = 0;
  function toast(text, bad) {
    toastEl.textContent = text;
    toastEl.classList.toggle("bad", bad);
    toastEl.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => (toastEl.hidden = true), bad ? 10000 : 4000);
  }

  // ---- start ---------------------------------------------------------------

  document.addEventListener("visibilitychange", () => schedule(0));
  relabel();
  setInterval(relabel, 1000); // relabels times in place; asks the server nothing
  syncSwapLog();
  staleTimers(document);
  connect();
})();
