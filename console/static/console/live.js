/* Live job pages: the list and the detail page update in place over /ws/training-jobs/.
 *
 * The server renders every page complete; this script only keeps it current. It connects the
 * socket (socket.js: reconnects with backoff), and on each (re)connection fetches a catch-up
 * snapshot of the jobs on the page, so a change made while the socket was down is never missed.
 * It never reloads the page; without JavaScript a plain refresh does the same.
 */
import { connect } from "./socket.js";
import { duration, general, localTime, progressText, sizeText } from "./format.js";
import { listRefresher } from "./live_list.js";

const listTable = document.querySelector("[data-live-jobs]");
const header = document.querySelector("[data-live-job]");
const source = listTable || header;
const detailId = header ? header.getAttribute("data-job-id") : null;
const stateEls = document.querySelectorAll("[data-live-state]");
let clockOffset = 0; // server time minus this browser's time, in ms
const liveSince = {}; // job id -> performance.now() of the last live message about it
let announcer = null;
const rows = listTable ? listRefresher(listTable, { onRefreshed: () => { tick(); catchUp(); } }) : null;

function serverNow() { return Date.now() + clockOffset; }

// --- clocks: running time and time since the last checkpoint, every second -------------------
// The running time is what the job's attempts ran (data-ran-seconds, from the server); only while
// the job is Running does the server give data-running-since, and only then does it count on, so
// it stands still while the job waits in Pending (a failover) between attempts.
function tickRunningTime(el) {
  const ran = el.getAttribute("data-ran-seconds");
  if (ran === null) { return; }
  const since = el.getAttribute("data-running-since");
  const counted = since ? Math.max(0, (serverNow() - Date.parse(since)) / 1000) : 0;
  const text = duration(Number(ran) + counted);
  if (el.textContent !== text) { el.textContent = text; }
}

// Only a running job's work is at risk: the time since its last checkpoint counts on while it runs.
function tickAtRisk(box) {
  if (box.getAttribute("data-running") !== "true") { return; }
  const since = box.getAttribute("data-since-at");
  const out = box.querySelector('[data-field="since_checkpoint"]');
  if (!since || !out) { return; }
  const text = duration((serverNow() - Date.parse(since)) / 1000);
  if (out.textContent !== text) { out.textContent = text; }
}

function tick() {
  document.querySelectorAll('[data-field="running_time"][data-running-since]').forEach(tickRunningTime);
  document.querySelectorAll("[data-at-risk]").forEach(tickAtRisk);
}

// --- applying a job's state to the page --------------------------------------------------------
function setState(text, kind) {
  stateEls.forEach((el) => {
    el.hidden = false;
    el.textContent = text;
    el.className = "live-state live-state--" + kind;
  });
}

// The elements that show one job: its row on the list, the whole page on its detail page.
function scopesOf(id) {
  if (detailId !== null) { return String(id) === detailId ? [document] : []; }
  return Array.from(source.querySelectorAll('tr[data-job-id="' + id + '"]'));
}

function each(scope, selector, fn) {
  scope.querySelectorAll(selector).forEach(fn);
}

function setText(el, text) { if (el.textContent !== text) { el.textContent = text; } }

function setBadge(badge, job) {
  if (badge.getAttribute("data-status") === job.status) { return; }
  badge.className = "badge badge--" + job.badge;
  badge.setAttribute("data-status", job.status);
  badge.setAttribute("data-badge-group", job.badge);
  const use = badge.querySelector("use");
  if (use) { use.setAttribute("href", "#icon-" + job.icon); }
  setText(badge.querySelector(".badge__text"), job.status);
}

// A "created" or "resumes" message says the job's status live: it turns red or amber with it, so
// a green banner never sits above "It is Pending - internalerror".
const MESSAGE_TONES = { error: ["error", "alert"], warning: ["warning", "alert"], failover: ["warning", "refresh"] };

function toneMessage(message, job) {
  if (!message) { return; }
  const [tone, icon] = MESSAGE_TONES[job.badge] || ["success", "check"];
  message.className = "message message--" + tone;
  message.setAttribute("data-tone", tone);
  const use = message.querySelector("use");
  if (use) { use.setAttribute("href", "#icon-" + icon); }
}

function setRunningTime(el, job) {
  const known = job.ran_seconds !== null && job.ran_seconds !== undefined;
  if (known) { el.setAttribute("data-ran-seconds", String(job.ran_seconds)); } else { el.removeAttribute("data-ran-seconds"); }
  if (known && job.running_since && job.status === "Running") { el.setAttribute("data-running-since", job.running_since); } else { el.removeAttribute("data-running-since"); }
  if (known) { tickRunningTime(el); } else { setText(el, "—"); }
}

function setTimeField(el, iso) {
  if (!iso) { setText(el, "—"); return; }
  let time = el.querySelector("time");
  if (time && time.getAttribute("datetime") && Date.parse(time.getAttribute("datetime")) === Date.parse(iso)) { return; }
  el.textContent = "";
  time = document.createElement("time");
  time.setAttribute("datetime", iso);
  time.textContent = localTime(iso);
  el.appendChild(time);
}

function applyProgress(scope, progress) {
  each(scope, '[data-field="progress"]', (box) => {
    const bar = box.querySelector("progress");
    const percent = progress && progress.percent !== null && progress.percent !== undefined ? Math.round(progress.percent) : null;
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
    const text = box.querySelector("[data-progress-text]");
    if (text) { setText(text, (percent === null ? "" : percent + "% · ") + progressText(progress)); }
  });
}

function applyJob(job) {
  scopesOf(job.id).forEach((scope) => {
    let previous = null;
    const reasonEl = scope === document ? document.querySelector('.job-header [data-field="status_reason"]') : null;
    const previousReason = reasonEl ? reasonEl.getAttribute("title") || reasonEl.textContent : null;
    each(scope, '[data-field="status"]', (badge) => {
      previous = previous || badge.getAttribute("data-status");
      setBadge(badge, job);
    });
    if (scope !== document) { scope.setAttribute("data-status", job.status); } else { header.setAttribute("data-status", job.status); }
    each(scope, '[data-field="status_reason"]', (el) => {
      const shown = el.tagName === "DIV" && job.reason.length > 70 ? job.reason.slice(0, 69) + "…" : job.reason;
      setText(el, shown);
      el.setAttribute("title", job.reason);
      if (el.tagName === "DIV") { el.hidden = !job.reason; }
    });
    each(scope, '[data-field="status_text"]', (el) => { setText(el, job.status); toneMessage(el.closest(".message"), job); });
    each(scope, '[data-field="failover_count"]', (el) => { setText(el, job.failover_count + "/" + job.max_failovers); });
    each(scope, '[data-field="running_time"]', (el) => { setRunningTime(el, job); });
    each(scope, '[data-field="started_at"]', (el) => { setTimeField(el, job.started_at); });
    each(scope, '[data-field="finished_at"]', (el) => { setTimeField(el, job.finished_at); });
    each(scope, "[data-hide-unless-stoppable]", (el) => { el.hidden = !job.stoppable; });
    each(scope, "[data-at-risk]", (box) => {
      const running = job.status === "Running";
      box.setAttribute("data-running", running ? "true" : "false");
      const note = box.querySelector("[data-at-risk-note]");
      if (note) {
        setText(note, running ? "The work at risk if the node died now: training resumes from the last checkpoint."
          : "The job is not running now, so no work is at risk.");
      }
      if (!job.last_checkpoint_at && job.started_at && !box.getAttribute("data-since-at")) { box.setAttribute("data-since-at", job.started_at); }
    });
    if (job.progress) { applyProgress(scope, job.progress); }
    if (scope === document && previous && previous !== job.status) {
      if (announcer) { announcer.textContent = "Status: " + job.status + (job.reason ? ". " + job.reason : ""); }
      refreshRegions();
    } else if (scope === document && previousReason !== null && previousReason !== job.reason) {
      // A new reason in the same status (placed, starting, a failover's steps): the attempts and
      // tabs say the same as the header.
      refreshRegions();
    }
  });
}

function addCheckpoints(checkpoints) {
  const rows = document.querySelector("[data-checkpoint-rows]");
  const box = document.querySelector("[data-at-risk]");
  checkpoints.forEach((c) => {
    if (box) {
      box.setAttribute("data-since-at", c.committed_at);
      box.setAttribute("data-since-kind", "checkpoint");
      const label = box.querySelector("[data-at-risk-label]");
      if (label) { setText(label, "Time since the last checkpoint"); }
      tickAtRisk(box);
    }
    if (!rows) { return; }
    const old = rows.querySelector('tr[data-step="' + c.step + '"][data-attempt="' + c.attempt + '"]');
    const tr = document.createElement("tr");
    tr.setAttribute("data-step", c.step);
    tr.setAttribute("data-attempt", c.attempt);
    const cells = [
      [String(c.step), "num"], [null, ""], [String(c.attempt), "num"], [sizeText(c.bytes), "num"],
      [general(c.blocking_s, 3) + " s", "num"], [general(c.persist_s, 3) + " s", "num"], [c.path, "mono small"]
    ];
    cells.forEach((cell, index) => {
      const td = document.createElement("td");
      if (cell[1]) { td.className = cell[1]; }
      if (index === 1) { setTimeField(td, c.committed_at); } else { td.textContent = cell[0]; }
      if (index === 3) { td.title = c.bytes + " bytes" + (c.ranks > 1 ? " from " + c.ranks + " ranks" : ""); }
      tr.appendChild(td);
    });
    if (old) { rows.replaceChild(tr, old); } else { rows.insertBefore(tr, rows.firstChild); }
    const empty = document.querySelector("[data-checkpoints-empty]");
    if (empty) { empty.hidden = true; }
  });
  if (checkpoints.length) { warnIfLost(checkpoints[checkpoints.length - 1].path || ""); }
}

// A running job's newest commit outside its work and output directories is lost on a failover.
function warnIfLost(path) {
  const warning = document.querySelector("[data-checkpoint-warning]");
  if (!warning || warning.getAttribute("data-watch") !== "true" || !path) { return; }
  const names = path.split("/");
  const plain = path.charAt(0) === "/" && names.slice(1).every((n) => n && n !== "." && n !== "..");
  const kept = plain && (warning.getAttribute("data-storage-names") || "").split("|").some(
    (base) => base && path.length > base.length && path.slice(0, base.length + 1) === base + "/"
  );
  const field = warning.querySelector('[data-field="lost_checkpoint"]');
  if (field) { setText(field, path); }
  warning.hidden = kept;
}

// The detail page's server-rendered parts (actions, properties, attempts, the loss points, the
// failover and events tabs: each a [data-live-region]) are re-read, not the page, when the status
// changes or the socket (re)connects; loss_chart.js hears "console:regions" and redraws.
let refreshTimer = null;
function refreshRegions() {
  if (detailId === null || !document.querySelector("[data-live-region]")) { return; }
  window.clearTimeout(refreshTimer);
  refreshTimer = window.setTimeout(() => {
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html", "X-Live-Refresh": "1" } })
      .then((response) => (response.ok ? response.text() : null))
      .then((html) => {
        if (!html) { return; }
        const fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-region]").forEach((region) => {
          const name = region.getAttribute("data-live-region");
          const theirs = fresh.querySelector('[data-live-region="' + name + '"]');
          if (theirs && theirs.innerHTML !== region.innerHTML) { region.innerHTML = theirs.innerHTML; }
        });
        tick();
        document.dispatchEvent(new CustomEvent("console:regions"));
      })
      .catch(() => { /* the next status change tries again */ });
  }, 300);
}

// --- the socket and the catch-up snapshot --------------------------------------------------------
function jobIds() {
  if (detailId !== null) { return [detailId]; }
  return Array.from(source.querySelectorAll("tr[data-job-id]"), (tr) => tr.getAttribute("data-job-id"));
}

function learnClock(now) {
  const parsed = Date.parse(now);
  if (!isNaN(parsed)) { clockOffset = parsed - Date.now(); }
}

// After (re)connecting: the state of every job on the page, in one request.
function catchUp() {
  const ids = jobIds();
  if (!ids.length) { return; }
  const asked = performance.now();
  const url = source.getAttribute("data-live-url") + "?ids=" + ids.join(",");
  fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then((response) => (response.ok ? response.json() : null))
    .then((body) => {
      if (!body) { return; }
      learnClock(body.now);
      body.jobs.forEach((job) => {
        // A live message that came after the request was made is newer than this snapshot.
        if ((liveSince[job.id] || 0) > asked) { return; }
        applyJob(job);
      });
    })
    .catch(() => { /* the socket's messages still arrive; the next reconnection retries */ });
}

function handle(message) {
  if (message.now) { learnClock(message.now); }
  if (message.type === "ready") {
    setState("Live", "on");
    // The list re-reads its rows (jobs created or deleted while the socket was down); the detail page its job.
    if (rows) { rows.schedule(); } else { catchUp(); refreshRegions(); }
  } else if (message.type === "job") {
    liveSince[message.job.id] = performance.now();
    if (rows && rows.changesRows(message.job)) { rows.schedule(); }
    applyJob(message.job);
  } else if (message.type === "deleted") {
    if (rows && rows.shows(message.job)) { rows.schedule(); }
    if (detailId !== null && String(message.job) === detailId) { setState("This job was deleted", "off"); }
  } else if (message.type === "progress") {
    liveSince[message.job] = performance.now();
    scopesOf(message.job).forEach((scope) => {
      if (message.progress) { applyProgress(scope, message.progress); }
    });
    if (detailId !== null && String(message.job) === detailId) {
      if (message.checkpoints && message.checkpoints.length) { addCheckpoints(message.checkpoints); }
      document.dispatchEvent(new CustomEvent("console:progress", { detail: message }));
    }
  }
}

function onSocketState(state) {
  if (state === "reconnecting") { setState("Reconnecting…", "retry"); }
  if (state === "refused") { setState("Live updates off: refresh the page", "off"); }
}

tick();
window.setInterval(tick, 1000);

if (source) {
  if (header) {
    announcer = document.createElement("div");
    announcer.className = "visually-hidden";
    announcer.setAttribute("role", "status");
    announcer.setAttribute("aria-live", "polite");
    document.body.appendChild(announcer);
  }
  setState("Connecting…", "retry");
  connect(source.getAttribute("data-socket-path"), { onMessage: handle, onState: onSocketState });
}
