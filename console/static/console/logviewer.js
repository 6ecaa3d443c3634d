/* The Logs tab's viewer: a virtualized, live view of one log stream of a Training Job.
 *
 * Without JavaScript the tab shows the server-rendered last lines (the [data-lv-fallback] list);
 * this module reads those lines as its first page, removes the list and shows the viewer instead.
 * The parts, each in logviewer/:
 * - segment.js: the lines held (one contiguous run of seqs) and their layout; attempts.js: the
 *   attempts seen, banner texts and the attempt filter.
 * - rows.js: the virtual list (only the rows in view exist in the DOM); markup.js: a row's elements.
 * - transport.js: REST pages and the live socket (socket.js reconnects it); tail.js: live lines.
 * - pages.js: loading pages near an edge, Top, Bottom, going to a line.
 * - search.js, controls.js: the search form and results, the toggles, buttons and links.
 * - status.js: the status line (following or paused, connection, end).
 */
import { createAttempts } from "./logviewer/attempts.js";
import { initControls } from "./logviewer/controls.js";
import { createPages, seqFromHash } from "./logviewer/pages.js";
import { createRows } from "./logviewer/rows.js";
import { initSearch } from "./logviewer/search.js";
import { createSegment } from "./logviewer/segment.js";
import { createStatus } from "./logviewer/status.js";
import { followTail } from "./logviewer/tail.js";
import { createTransport } from "./logviewer/transport.js";

// The server-rendered lines: the viewer's first page.
function readFallback(fallback) {
  if (!fallback) { return []; }
  return Array.from(fallback.querySelectorAll("li[data-seq]"), (li) => {
    const time = li.querySelector("time"), text = li.querySelector(".log__text");
    return {
      seq: parseInt(li.getAttribute("data-seq"), 10),
      attempt: parseInt(li.getAttribute("data-attempt"), 10) || 1,
      ts: time ? time.getAttribute("datetime") : "",
      text: text ? text.textContent : ""
    };
  });
}

function start(root) {
  const $ = (selector) => root.querySelector(selector);
  const el = {
    viewport: $("[data-lv-viewport]"), canvas: $("[data-lv-canvas]"), rows: $("[data-lv-rows]"),
    empty: $("[data-lv-empty]"), status: $("[data-lv-status]"),
    follow: $("[data-lv-follow]"), timestamps: $("[data-lv-timestamps]"), wrap: $("[data-lv-wrap]"),
    attempt: $("[data-lv-attempt]"), top: $("[data-lv-top]"), bottom: $("[data-lv-bottom]"),
    newCount: $("[data-lv-new-count]"),
    searchForm: $("[data-lv-search-form]"), query: $("[data-lv-query]"), prev: $("[data-lv-prev-match]"),
    next: $("[data-lv-next-match]"), clear: $("[data-lv-clear-search]"), results: $("[data-lv-results]"),
    resultsSummary: $("[data-lv-results-summary]"), resultsList: $("[data-lv-results-list]"),
    moreResults: $("[data-lv-more-results]")
  };

  const fallback = document.querySelector("[data-lv-fallback]");
  const initial = readFallback(fallback);
  if (fallback) { fallback.remove(); }
  root.hidden = false;

  const transport = createTransport({
    api: root.getAttribute("data-api-url"),
    wsPath: root.getAttribute("data-ws-path"),
    stream: root.getAttribute("data-stream") || "master"
  });
  const attempts = createAttempts(el.attempt);
  const segment = createSegment(attempts);
  const status = createStatus({ root, statusEl: el.status, newCountEl: el.newCount, followBox: el.follow, segment });
  const rows = createRows({
    root, viewport: el.viewport, canvas: el.canvas, rowsEl: el.rows, emptyEl: el.empty, segment, attempts
  });
  const pages = createPages({ fetchPage: transport.fetchPage, segment, rows, status, attempts });
  initControls({ el, segment, rows, status, pages });
  initSearch({ el, fetchPage: transport.fetchPage, rows, pages });

  rows.replace(initial);
  if (initial.length) { segment.liveSeq = initial[initial.length - 1].seq; }
  segment.atTail = true;

  const target = seqFromHash();
  if (target) {
    pages.goToSeq(target);
    root.scrollIntoView({ block: "start" });
  } else {
    rows.scrollToBottom();
  }
  status.show();
  followTail({ transport, segment, rows, status, attempts, resumeKnown: initial.length > 0 });

  // For tests and the browser console: what the viewer holds, and its navigation.
  root.logViewer = {
    loadedSeqs: () => segment.lines.map((l) => l.seq),
    goToSeq: pages.goToSeq, jumpTop: pages.jumpTop, jumpBottom: pages.jumpBottom
  };
}

const viewer = document.querySelector("[data-log-viewer]");
if (viewer) { start(viewer); }
