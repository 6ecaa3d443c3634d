/* Live job pages: the list and the detail page update in place over /ws/training-jobs/.
 *
 * The server renders every page complete; this script only keeps it current. It connects the
 * socket, and on each (re)connection fetches a catch-up snapshot of the jobs on the page, so a
 * change made while the socket was down is never missed. Reconnects back off (1 s doubling to
 * 30 s, with jitter). It never reloads the page; without JavaScript a plain refresh does the same.
 */
(function () {
  "use strict";

  var listTable = document.querySelector("[data-live-jobs]");
  var header = document.querySelector("[data-live-job]");
  var source = listTable || header;
  var clockOffset = 0; // server time minus this browser's time, in ms
  var liveSince = {}; // job id -> performance.now() of the last live message about it

  // --- formatting (the server's templates say the same things the same way) -------------------
  function duration(totalSeconds) {
    var s = Math.max(0, Math.floor(totalSeconds));
    var days = Math.floor(s / 86400); s -= days * 86400;
    var hours = Math.floor(s / 3600); s -= hours * 3600;
    var minutes = Math.floor(s / 60); s -= minutes * 60;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (days) { return days + "d " + hours + "h " + pad(minutes) + "m"; }
    if (hours) { return hours + "h " + pad(minutes) + "m " + pad(s) + "s"; }
    if (minutes) { return minutes + "m " + pad(s) + "s"; }
    return s + "s";
  }

  // Python's format(x, ".Ng"), near enough: 0.036, 5e-05, 1.234.
  function general(x, digits) {
    if (x === null || x === undefined) { return "—"; }
    var abs = Math.abs(x);
    if (abs !== 0 && (abs < 1e-4 || abs >= Math.pow(10, digits))) {
      var parts = x.toExponential(digits - 1).split("e");
      var mantissa = parts[0].indexOf(".") >= 0 ? parts[0].replace(/0+$/, "").replace(/\.$/, "") : parts[0];
      var exponent = parseInt(parts[1], 10);
      return mantissa + "e" + (exponent < 0 ? "-" : "+") + (Math.abs(exponent) < 10 ? "0" : "") + Math.abs(exponent);
    }
    return String(Number(x.toPrecision(digits)));
  }

  function progressText(p) {
    if (!p) { return "—"; }
    var parts = [];
    if (p.step !== null && p.step !== undefined) { parts.push("step " + p.step + (p.total ? "/" + p.total : "")); }
    if (p.epoch !== null && p.epoch !== undefined) { parts.push("epoch " + general(p.epoch, 4)); }
    if (p.loss !== null && p.loss !== undefined) { parts.push("loss " + general(p.loss, 4)); }
    if (p.lr !== null && p.lr !== undefined) { parts.push("lr " + general(p.lr, 3)); }
    return parts.join(" · ") || "—";
  }

  function localTime(iso) {
    var d = new Date(iso);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function serverNow() { return Date.now() + clockOffset; }

  // --- clocks: running time and time since the last checkpoint, every second -----------------
  function tickRunningTime(el) {
    var started = el.getAttribute("data-started-at");
    if (!started) { return; }
    var finished = el.getAttribute("data-finished-at");
    var end = finished ? Date.parse(finished) : serverNow();
    var text = duration((end - Date.parse(started)) / 1000);
    if (el.textContent !== text) { el.textContent = text; }
  }

  function tickAtRisk(box) {
    var since = box.getAttribute("data-since-at");
    var out = box.querySelector('[data-field="since_checkpoint"]');
    if (!since || !out) { return; }
    var text = duration((serverNow() - Date.parse(since)) / 1000);
    if (out.textContent !== text) { out.textContent = text; }
  }

  function tick() {
    document.querySelectorAll('[data-field="running_time"][data-started-at]').forEach(tickRunningTime);
    document.querySelectorAll("[data-at-risk]").forEach(tickAtRisk);
  }
  tick();
  window.setInterval(tick, 1000);

  if (!source || !("WebSocket" in window) || !window.fetch) { return; }

  var detailId = header ? header.getAttribute("data-job-id") : null;
  var stateEls = document.querySelectorAll("[data-live-state]");
  var announcer = null;
  if (header) {
    announcer = document.createElement("div");
    announcer.className = "visually-hidden";
    announcer.setAttribute("role", "status");
    announcer.setAttribute("aria-live", "polite");
    document.body.appendChild(announcer);
  }

  function setState(text, kind) {
    stateEls.forEach(function (el) {
      el.hidden = false;
      el.textContent = text;
      el.className = "live-state live-state--" + kind;
    });
  }

  // The elements that show one job: its row on the list, the whole page on its detail page.
  function scopesOf(id) {
    if (detailId !== null) { return String(id) === detailId ? [document] : []; }
    return Array.prototype.slice.call(source.querySelectorAll('tr[data-job-id="' + id + '"]'));
  }

  function each(scope, selector, fn) {
    Array.prototype.forEach.call(scope.querySelectorAll(selector), fn);
  }

  function setText(el, text) { if (el.textContent !== text) { el.textContent = text; } }

  function setBadge(badge, job) {
    if (badge.getAttribute("data-status") === job.status) { return; }
    badge.className = "badge badge--" + job.badge;
    badge.setAttribute("data-status", job.status);
    badge.setAttribute("data-badge-group", job.badge);
    var use = badge.querySelector("use");
    if (use) { use.setAttribute("href", "#icon-" + job.icon); }
    setText(badge.querySelector(".badge__text"), job.status);
  }

  function setTimes(el, job) {
    if (job.started_at) { el.setAttribute("data-started-at", job.started_at); } else { el.removeAttribute("data-started-at"); }
    if (job.finished_at) { el.setAttribute("data-finished-at", job.finished_at); } else { el.removeAttribute("data-finished-at"); }
    if (job.started_at) { tickRunningTime(el); } else { setText(el, "—"); }
  }

  function setTimeField(el, iso) {
    if (!iso) { setText(el, "—"); return; }
    var time = el.querySelector("time");
    if (time && time.getAttribute("datetime") && Date.parse(time.getAttribute("datetime")) === Date.parse(iso)) { return; }
    el.textContent = "";
    time = document.createElement("time");
    time.setAttribute("datetime", iso);
    time.textContent = localTime(iso);
    el.appendChild(time);
  }

  function applyProgress(scope, progress) {
    each(scope, '[data-field="progress"]', function (box) {
      var bar = box.querySelector("progress");
      var percent = progress && progress.percent !== null && progress.percent !== undefined ? Math.round(progress.percent) : null;
      if (bar) {
        if (percent === null) {
          bar.removeAttribute("value");
          bar.hidden = true;
        } else {
          bar.value = percent;
          bar.textContent = percent + "%";
          bar.hidden = false;
        }
      }
      var text = box.querySelector("[data-progress-text]");
      if (text) { setText(text, (percent === null ? "" : percent + "% · ") + progressText(progress)); }
    });
  }

  function applyJob(job, from) {
    var scopes = scopesOf(job.id);
    scopes.forEach(function (scope) {
      var previous = null;
      each(scope, '[data-field="status"]', function (badge) {
        previous = previous || badge.getAttribute("data-status");
        setBadge(badge, job);
      });
      if (scope !== document) { scope.setAttribute("data-status", job.status); } else { header.setAttribute("data-status", job.status); }
      each(scope, '[data-field="status_reason"]', function (el) {
        var shown = el.tagName === "DIV" && job.reason.length > 70 ? job.reason.slice(0, 69) + "…" : job.reason;
        setText(el, shown);
        el.setAttribute("title", job.reason);
        if (el.tagName === "DIV") { el.hidden = !job.reason; }
      });
      each(scope, '[data-field="status_text"]', function (el) { setText(el, job.status); });
      each(scope, '[data-field="failover_count"]', function (el) { setText(el, job.failover_count + "/" + job.max_failovers); });
      each(scope, '[data-field="running_time"]', function (el) { setTimes(el, job); });
      each(scope, '[data-field="started_at"]', function (el) { setTimeField(el, job.started_at); });
      each(scope, '[data-field="finished_at"]', function (el) { setTimeField(el, job.finished_at); });
      each(scope, "[data-hide-unless-stoppable]", function (el) { el.hidden = !job.stoppable; });
      each(scope, "[data-at-risk]", function (box) {
        var running = job.status === "Running";
        box.setAttribute("data-running", running ? "true" : "false");
        var note = box.querySelector("[data-at-risk-note]");
        if (note) {
          setText(note, running ? "The work at risk if the node died now: training resumes from the last checkpoint."
            : "The job is not running now, so no work is at risk.");
        }
        if (!job.last_checkpoint_at && job.started_at && !box.getAttribute("data-since-at")) { box.setAttribute("data-since-at", job.started_at); }
      });
      if (job.progress) { applyProgress(scope, job.progress); }
      if (scope === document && previous && previous !== job.status) {
        if (announcer) { announcer.textContent = "Status: " + job.status + (job.reason ? ". " + job.reason : ""); }
        refreshTab();
      }
    });
  }

  function addCheckpoints(checkpoints) {
    var rows = document.querySelector("[data-checkpoint-rows]");
    var box = document.querySelector("[data-at-risk]");
    checkpoints.forEach(function (c) {
      if (box) {
        box.setAttribute("data-since-at", c.committed_at);
        box.setAttribute("data-since-kind", "checkpoint");
        var label = box.querySelector("[data-at-risk-label]");
        if (label) { setText(label, "Time since the last checkpoint"); }
        tickAtRisk(box);
      }
      if (!rows) { return; }
      var old = rows.querySelector('tr[data-step="' + c.step + '"][data-attempt="' + c.attempt + '"]');
      var tr = document.createElement("tr");
      tr.setAttribute("data-step", c.step);
      tr.setAttribute("data-attempt", c.attempt);
      var cells = [
        [String(c.step), "num"], [null, ""], [String(c.attempt), "num"], [sizeText(c.bytes), "num"],
        [general(c.blocking_s, 3) + " s", "num"], [general(c.persist_s, 3) + " s", "num"], [c.path, "mono small"]
      ];
      cells.forEach(function (cell, index) {
        var td = document.createElement("td");
        if (cell[1]) { td.className = cell[1]; }
        if (index === 1) { setTimeField(td, c.committed_at); } else { td.textContent = cell[0]; }
        if (index === 3) { td.title = c.bytes + " bytes" + (c.ranks > 1 ? " from " + c.ranks + " ranks" : ""); }
        tr.appendChild(td);
      });
      if (old) { rows.replaceChild(tr, old); } else { rows.insertBefore(tr, rows.firstChild); }
      var empty = document.querySelector("[data-checkpoints-empty]");
      if (empty) { empty.hidden = true; }
    });
  }

  function sizeText(bytes) {
    var units = ["bytes", "KB", "MB", "GB", "TB"];
    var value = bytes;
    var unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return unit === 0 ? bytes + " bytes" : value.toFixed(1) + "\u00a0" + units[unit];
  }

  // The failover and events tabs are re-read (not the page) when the status changes.
  var refreshTimer = null;
  function refreshTab() {
    var panel = document.querySelector("[data-refresh-on-status]");
    if (!panel) { return; }
    window.clearTimeout(refreshTimer);
    refreshTimer = window.setTimeout(function () {
      fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (!html) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-refresh-on-status]");
          if (fresh) { panel.innerHTML = fresh.innerHTML; }
        })
        .catch(function () { /* the next status change tries again */ });
    }, 300);
  }

  function jobIds() {
    if (detailId !== null) { return [detailId]; }
    return Array.prototype.map.call(source.querySelectorAll("tr[data-job-id]"), function (tr) { return tr.getAttribute("data-job-id"); });
  }

  function learnClock(now) {
    var parsed = Date.parse(now);
    if (!isNaN(parsed)) { clockOffset = parsed - Date.now(); }
  }

  // After (re)connecting: the state of every job on the page, in one request.
  function catchUp() {
    var ids = jobIds();
    if (!ids.length) { return; }
    var asked = performance.now();
    var url = source.getAttribute("data-live-url") + "?ids=" + ids.join(",");
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) {
        if (!body) { return; }
        learnClock(body.now);
        body.jobs.forEach(function (job) {
          // A live message that came after the request was made is newer than this snapshot.
          if ((liveSince[job.id] || 0) > asked) { return; }
          applyJob(job, null);
        });
      })
      .catch(function () { /* the socket's messages still arrive; the next reconnection retries */ });
  }

  function handle(message) {
    if (message.now) { learnClock(message.now); }
    if (message.type === "ready") {
      setState("Live", "on");
      catchUp();
    } else if (message.type === "job") {
      liveSince[message.job.id] = performance.now();
      applyJob(message.job, message.from);
    } else if (message.type === "progress") {
      liveSince[message.job] = performance.now();
      scopesOf(message.job).forEach(function (scope) {
        if (message.progress) { applyProgress(scope, message.progress); }
      });
      if (detailId !== null && String(message.job) === detailId) {
        if (message.checkpoints && message.checkpoints.length) { addCheckpoints(message.checkpoints); }
        document.dispatchEvent(new CustomEvent("console:progress", { detail: message }));
      }
    }
  }

  var socket = null;
  var failures = 0;
  var retryTimer = null;
  var url = (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + source.getAttribute("data-socket-path");

  function connect() {
    retryTimer = null;
    socket = new WebSocket(url);
    socket.onopen = function () { failures = 0; };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (error) { return; }
      handle(message);
    };
    socket.onclose = function (event) {
      socket = null;
      if (event.code === 4400 || event.code === 4401 || event.code === 4404) {
        setState("Live updates off: refresh the page", "off");
        return;
      }
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    if (retryTimer !== null) { return; }
    failures += 1;
    var delay = Math.min(30000, 1000 * Math.pow(2, failures - 1)) * (0.5 + Math.random() / 2);
    setState("Reconnecting…", "retry");
    retryTimer = window.setTimeout(connect, delay);
  }

  function reconnectNow() {
    if (socket === null && retryTimer !== null) {
      window.clearTimeout(retryTimer);
      connect();
    }
  }
  window.addEventListener("online", reconnectNow);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { reconnectNow(); } });
  window.addEventListener("pagehide", function () { if (socket) { socket.onclose = null; socket.close(); socket = null; } });
  window.addEventListener("pageshow", function (event) { if (event.persisted && socket === null && retryTimer === null) { connect(); } });

  setState("Connecting…", "retry");
  connect();
})();
