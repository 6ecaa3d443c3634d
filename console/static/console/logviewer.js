/* The Logs tab's viewer: a virtualized, live view of one log stream of a Training Job.
 *
 * Without JavaScript the tab shows the server-rendered last lines (the [data-lv-fallback] list);
 * this file reads those lines as its first page, removes the list and shows the viewer instead.
 *
 * Data flow:
 * - The viewer holds one contiguous segment of the stream (`state.lines`, ascending seq, at most
 *   MAX_LINES). Scrolling near its top loads the page before it over REST (`before=<first seq>`),
 *   near its bottom the page after it (`after=<last seq>`); Top loads from `after=0`, a #L<seq>
 *   link from `after=<seq-500>`, Bottom the tail page (`before=<big>`).
 * - One WebSocket (`/ws/training-jobs/<id>/logs/?stream=&after=<last seq>`) delivers live lines.
 *   `state.liveSeq` is the newest seq it delivered and the point a reconnect resumes from, so a
 *   reconnect leaves no gap and the seq check drops duplicates. Live lines join the segment only
 *   while it ends at the tail (`state.atTail`); otherwise REST fetches them when the user gets there.
 * - Only the rows in view (plus OVERSCAN) exist in the DOM. Rows are a fixed height when wrap is
 *   off; with wrap on, the unit height is an estimate measured from the rendered rows.
 * - Where the attempt changes in seq order, a failover banner (role="note") sits between lines;
 *   its text comes from the socket's `attempts` message.
 */
(function () {
  "use strict";

  var root = document.querySelector("[data-log-viewer]");
  if (!root || !window.WebSocket || !window.fetch || !window.URLSearchParams) { return; }

  var PAGE = 1000;            // lines per REST page
  var AROUND = 500;           // a #L<seq> link loads from seq - AROUND
  var MAX_LINES = 50000;      // the segment kept in memory; the far end is dropped beyond it
  var OVERSCAN = 30;          // rows rendered above and below the visible ones
  var LOAD_MARGIN = 40;       // rows from an edge at which the next page is fetched
  var BANNER_UNITS = 2;       // a banner is two rows tall
  var TAIL_BEFORE = "999999999999999";
  var SEARCH_PAGE = 200;
  var REFUSED = { 4400: "the request was refused", 4401: "you are signed out", 4404: "the job is not found" };

  function $(selector) { return root.querySelector(selector); }
  var el = {
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
  var fallback = document.querySelector("[data-lv-fallback]");
  var vp = el.viewport;

  var state = {
    stream: root.getAttribute("data-stream") || "master",
    api: root.getAttribute("data-api-url"),
    wsPath: root.getAttribute("data-ws-path"),
    lines: [], hasOlder: false, atTail: true, liveSeq: 0, resumeKnown: false,
    items: [], starts: [], totalUnits: 0, lastShown: null,
    banners: {}, maxAttempt: 0, attemptFilter: 0,
    follow: true, ended: false, endStatus: "", conn: "connecting", retries: 0, retryTimer: null, socket: null,
    loading: false, generation: 0, error: "",
    query: "", matches: [], matchIndex: -1, matchesMore: false, matchesNext: null,
    highlightSeq: null, newLines: 0,
    unitPx: 20, baseUnitPx: 20, wrap: false,
    version: 0, renderKey: "", frame: 0, programmaticTop: -1
  };

  // --- preferences -------------------------------------------------------------------------
  function pref(name, fallbackValue) {
    try { var v = window.localStorage.getItem("logviewer." + name); return v === null ? fallbackValue : v === "1"; }
    catch (e) { return fallbackValue; }
  }
  function savePref(name, value) {
    try { window.localStorage.setItem("logviewer." + name, value ? "1" : "0"); } catch (e) { /* private mode */ }
  }

  // --- the segment and its rows ------------------------------------------------------------
  function lastLine() { return state.lines.length ? state.lines[state.lines.length - 1] : null; }

  function addItem(item) {
    state.items.push(item);
    state.starts.push(state.totalUnits);
    state.totalUnits += item.line ? 1 : BANNER_UNITS;
  }

  function showLine(line) {
    if (state.attemptFilter && line.attempt !== state.attemptFilter) { return; }
    var prev = state.lastShown;
    if (!state.attemptFilter && prev && prev.attempt !== line.attempt) {
      addItem({ banner: true, attempt: line.attempt, seq: line.seq });
    }
    addItem({ line: line, seq: line.seq });
    state.lastShown = line;
  }

  function noteAttempt(attempt) {
    if (attempt > state.maxAttempt) {
      state.maxAttempt = attempt;
      refreshAttemptOptions();
    }
  }

  function rebuild() {
    state.items = []; state.starts = []; state.totalUnits = 0; state.lastShown = null;
    for (var i = 0; i < state.lines.length; i++) { showLine(state.lines[i]); }
    state.version++;
    updateCanvas();
  }

  function appendLines(lines) {
    var last = lastLine();
    var fresh = last ? lines.filter(function (l) { return l.seq > last.seq; }) : lines.slice();
    if (!fresh.length) { return fresh; }
    if (!state.lines.length) { state.hasOlder = fresh[0].seq > 1; }
    for (var i = 0; i < fresh.length; i++) {
      state.lines.push(fresh[i]);
      noteAttempt(fresh[i].attempt);
      showLine(fresh[i]);
    }
    state.version++;
    if (state.lines.length > MAX_LINES) {
      state.lines = state.lines.slice(state.lines.length - MAX_LINES);
      state.hasOlder = true;
      keepingPlace(rebuild);
    }
    updateCanvas();
    return fresh;
  }

  function replaceLines(lines) {
    state.lines = lines.slice();
    state.hasOlder = lines.length ? lines[0].seq > 1 : false;
    lines.forEach(function (l) { noteAttempt(l.attempt); });
    rebuild();
  }

  // The first item whose seq is >= seq, skipping to the line when it lands on a banner.
  function itemIndexOfSeq(seq) {
    var lo = 0, hi = state.items.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (state.items[mid].seq < seq) { lo = mid + 1; } else { hi = mid; }
    }
    if (lo >= state.items.length) { return state.items.length - 1; }
    if (state.items[lo].banner && lo + 1 < state.items.length) { lo++; }
    return lo;
  }

  function indexAtUnit(unit) {
    var lo = 0, hi = state.starts.length - 1;
    if (hi < 0) { return 0; }
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (state.starts[mid] <= unit) { lo = mid; } else { hi = mid - 1; }
    }
    return lo;
  }

  // Keeps the line at the top of the view where it is across a change of the segment.
  function keepingPlace(change) {
    var anchor = null;
    if (state.items.length) {
      var i = indexAtUnit(vp.scrollTop / state.unitPx);
      while (i < state.items.length && !state.items[i].line) { i++; }
      if (i < state.items.length) { anchor = { seq: state.items[i].seq, delta: state.starts[i] * state.unitPx - vp.scrollTop }; }
    }
    change();
    if (anchor && state.items.length) {
      var j = itemIndexOfSeq(anchor.seq);
      setScrollTop(state.starts[j] * state.unitPx - anchor.delta);
    }
  }

  // --- rendering ---------------------------------------------------------------------------
  function updateCanvas() {
    el.canvas.style.height = Math.ceil(state.totalUnits * state.unitPx) + "px";
  }

  function setScrollTop(y) {
    vp.scrollTop = Math.max(0, y);
    state.programmaticTop = vp.scrollTop;
  }

  function pad(n, width) { var s = String(n); while (s.length < (width || 2)) { s = "0" + s; } return s; }

  function timeText(line) {
    if (line.timeText === undefined) {
      var d = new Date(line.ts);
      line.timeText = isNaN(d.getTime()) ? "" : pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." + pad(d.getMilliseconds(), 3);
    }
    return line.timeText;
  }

  function appendHighlighted(parent, text, query) {
    if (!query) { parent.textContent = text; return; }
    var lower = text.toLowerCase(), needle = query.toLowerCase(), from = 0, at;
    while ((at = lower.indexOf(needle, from)) !== -1) {
      if (at > from) { parent.appendChild(document.createTextNode(text.slice(from, at))); }
      var mark = document.createElement("mark");
      mark.textContent = text.slice(at, at + needle.length);
      parent.appendChild(mark);
      from = at + needle.length;
    }
    if (from < text.length) { parent.appendChild(document.createTextNode(text.slice(from))); }
  }

  function bannerText(attempt) {
    return state.banners[attempt] || "Attempt " + attempt + " started";
  }

  function bannerRow(item) {
    var row = document.createElement("div");
    row.className = "lv-banner";
    row.setAttribute("role", "note");
    row.setAttribute("data-attempt", item.attempt);
    row.innerHTML = '<svg class="icon" aria-hidden="true" focusable="false"><use href="#icon-refresh"></use></svg>';
    var label = document.createElement("strong");
    label.textContent = "Failover · attempt " + item.attempt + ": ";
    var text = document.createElement("span");
    text.className = "lv-banner__text";
    text.textContent = bannerText(item.attempt);
    row.title = text.textContent;
    row.appendChild(label);
    row.appendChild(text);
    return row;
  }

  function lineRow(line) {
    var row = document.createElement("div");
    row.className = "lv-row";
    if (line.seq === state.highlightSeq) { row.className += " is-target"; }
    row.setAttribute("data-seq", line.seq);
    row.setAttribute("data-attempt", line.attempt);
    var num = document.createElement("a");
    num.className = "lv-num";
    num.href = "#L" + line.seq;
    num.tabIndex = -1;
    num.textContent = line.seq;
    num.title = "Link to line " + line.seq;
    var time = document.createElement("time");
    time.className = "lv-ts";
    time.dateTime = line.ts;
    time.textContent = timeText(line);
    var text = document.createElement("span");
    text.className = "lv-text";
    appendHighlighted(text, line.text, state.query);
    row.appendChild(num);
    row.appendChild(time);
    row.appendChild(text);
    return row;
  }

  function schedule() {
    if (!state.frame) {
      state.frame = window.requestAnimationFrame(function () { state.frame = 0; render(); maybeLoad(); });
    }
  }

  function render() {
    el.empty.hidden = state.lines.length > 0 || state.loading;
    var count = state.items.length;
    if (!count) {
      if (el.rows.firstChild) { el.rows.textContent = ""; }
      state.renderKey = "";
      return;
    }
    var u = state.unitPx, top = vp.scrollTop, height = vp.clientHeight || 400;
    var first = indexAtUnit(Math.floor(top / u));
    // Enough rows to fill the view even if every row is only the base height (wrap mode).
    var lastVisible = Math.min(count - 1, first + Math.ceil(height / state.baseUnitPx));
    var start = Math.max(0, first - OVERSCAN);
    var end = Math.min(count, lastVisible + OVERSCAN + 1);
    var key = start + ":" + end + ":" + state.version + ":" + u;
    if (key === state.renderKey) { return; }
    state.renderKey = key;
    var fragment = document.createDocumentFragment();
    for (var i = start; i < end; i++) {
      var item = state.items[i];
      fragment.appendChild(item.line ? lineRow(item.line) : bannerRow(item));
    }
    el.rows.style.transform = "translateY(" + Math.round(state.starts[start] * u) + "px)";
    el.rows.textContent = "";
    el.rows.appendChild(fragment);
    if (state.wrap) { measureWrappedRows(start, end); }
  }

  // With wrap on, rows differ in height: the unit becomes the rendered rows' average.
  function measureWrappedRows(start, end) {
    var units = state.starts[end - 1] - state.starts[start] + (state.items[end - 1].line ? 1 : BANNER_UNITS);
    var measured = el.rows.offsetHeight / Math.max(units, 1);
    if (measured > 0 && Math.abs(measured - state.unitPx) / state.unitPx > 0.15) {
      keepingPlace(function () { state.unitPx = Math.max(state.baseUnitPx, measured); updateCanvas(); });
      state.renderKey = "";
      schedule();
    }
  }

  function isNearBottom() {
    return vp.scrollTop + vp.clientHeight >= vp.scrollHeight - state.baseUnitPx * 1.5;
  }

  function scrollToBottom() {
    updateCanvas();
    setScrollTop(vp.scrollHeight);
    render();
    if (state.wrap) { setScrollTop(vp.scrollHeight); render(); }
  }

  function centerOn(seq) {
    if (!state.items.length) { return; }
    updateCanvas();
    var i = itemIndexOfSeq(seq);
    setScrollTop(state.starts[i] * state.unitPx - (vp.clientHeight - state.unitPx) / 2);
    state.renderKey = "";
    render();
    var row = el.rows.querySelector('.lv-row[data-seq="' + seq + '"]');
    if (row && state.wrap) {
      var offset = row.getBoundingClientRect().top - vp.getBoundingClientRect().top;
      setScrollTop(vp.scrollTop + offset - (vp.clientHeight - row.offsetHeight) / 2);
      render();
    }
  }

  // --- status --------------------------------------------------------------------------------
  function setStatus() {
    var kind, text;
    if (state.ended) {
      kind = "ended"; text = "Ended: the job is " + state.endStatus + ". No more lines will come.";
    } else if (state.conn === "refused") {
      kind = "error"; text = "Live updates stopped: " + state.refusedWhy + ". Reload the page.";
    } else if (state.conn === "reconnecting") {
      kind = "reconnecting"; text = "Connection lost. Reconnecting in " + state.retryIn + " s, from line " + state.liveSeq + ".";
    } else if (state.conn === "connecting") {
      kind = "connecting"; text = "Connecting…";
    } else if (state.follow) {
      kind = "following"; text = "Following new lines.";
    } else {
      kind = "paused"; text = "Paused: not following new lines. Press Bottom or End to follow.";
    }
    if (state.error) { text += " " + state.error; }
    el.status.setAttribute("data-state", kind);
    root.setAttribute("data-state", kind);
    if (el.status.textContent !== text) { el.status.textContent = text; }
    el.newCount.textContent = !state.follow && state.newLines ? " (" + state.newLines + " new)" : "";
  }

  function setFollow(on) {
    if (on === state.follow) { return; }
    state.follow = on;
    el.follow.checked = on;
    if (on) { state.newLines = 0; }
    setStatus();
  }

  function setLoading(on) {
    state.loading = on;
    root.classList.toggle("is-loading", on);
    vp.setAttribute("aria-busy", on ? "true" : "false");
  }

  // --- REST ----------------------------------------------------------------------------------
  function fetchPage(params) {
    var query = new URLSearchParams({ stream: state.stream });
    Object.keys(params).forEach(function (k) { query.set(k, params[k]); });
    return window.fetch(state.api + "?" + query.toString(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      });
  }

  // One navigation or page load at a time; a newer navigation makes older answers stale.
  function load(params, apply, navigation) {
    var generation = navigation ? ++state.generation : state.generation;
    setLoading(true);
    return fetchPage(params).then(function (page) {
      if (generation !== state.generation) { return; }
      state.error = "";
      apply(page);
    }).catch(function (error) {
      if (generation !== state.generation) { return; }
      state.error = "Could not load log lines (" + error.message + ").";
    }).then(function () {
      if (generation === state.generation) { setLoading(false); }
      setStatus();
      schedule();
    });
  }

  function reachedTailIfDone(page) {
    var last = lastLine();
    state.atTail = !page.has_more && (!last || last.seq >= state.liveSeq);
  }

  function loadOlder() {
    var first = state.lines[0];
    load({ before: first.seq, limit: PAGE }, function (page) {
      state.hasOlder = page.has_more;
      var older = page.lines.filter(function (l) { return l.seq < first.seq; });
      if (!older.length) { return; }
      older.forEach(function (l) { noteAttempt(l.attempt); });
      keepingPlace(function () {
        state.lines = older.concat(state.lines);
        if (state.lines.length > MAX_LINES) {
          state.lines.length = MAX_LINES;
          state.atTail = false;
        }
        rebuild();
      });
    });
  }

  function loadNewer() {
    var last = lastLine();
    load({ after: last.seq, limit: PAGE }, function (page) {
      var fresh = page.lines.filter(function (l) { return l.seq > last.seq; });
      fresh.forEach(function (l) { noteAttempt(l.attempt); });
      keepingPlace(function () {
        state.lines = state.lines.concat(fresh);
        if (state.lines.length > MAX_LINES) {
          state.lines = state.lines.slice(state.lines.length - MAX_LINES);
          state.hasOlder = true;
        }
        rebuild();
      });
      reachedTailIfDone(page);
    });
  }

  function maybeLoad() {
    if (state.loading || !state.lines.length) { return; }
    var margin = LOAD_MARGIN * state.unitPx;
    if (state.hasOlder && vp.scrollTop < margin) {
      loadOlder();
    } else if (!state.atTail && vp.scrollTop + vp.clientHeight > vp.scrollHeight - margin) {
      loadNewer();
    }
  }

  function jumpTop() {
    setFollow(false);
    state.highlightSeq = null;
    load({ after: 0, limit: PAGE }, function (page) {
      replaceLines(page.lines);
      state.hasOlder = false;
      reachedTailIfDone(page);
      setScrollTop(0);
      state.renderKey = "";
      render();
    }, true);
  }

  function jumpBottom() {
    state.newLines = 0;
    state.highlightSeq = null;
    if (state.atTail) {
      state.generation++;
      setLoading(false);
      setFollow(true);
      state.renderKey = "";
      scrollToBottom();
      setStatus();
      return;
    }
    setFollow(true);
    load({ before: TAIL_BEFORE, limit: PAGE }, function (page) {
      replaceLines(page.lines);
      state.hasOlder = page.has_more;
      var last = lastLine();
      state.atTail = !last || last.seq >= state.liveSeq;
      state.renderKey = "";
      scrollToBottom();
    }, true);
  }

  function goToSeq(seq) {
    if (!(seq > 0)) { return; }
    setFollow(false);
    state.highlightSeq = seq;
    state.version++;
    var first = state.lines[0], last = lastLine();
    var target = null;
    if (first && seq >= first.seq && seq <= last.seq) {
      target = state.lines[lineIndexOfSeq(seq)];
    }
    if (target && state.attemptFilter && target.attempt !== state.attemptFilter) {
      setAttemptFilter(0);
    }
    if (target) {
      centerOn(seq);
      setStatus();
      return;
    }
    if (state.attemptFilter) { setAttemptFilter(0); }
    load({ after: Math.max(seq - AROUND, 0), limit: PAGE }, function (page) {
      replaceLines(page.lines);
      reachedTailIfDone(page);
      centerOn(seq);
    }, true);
  }

  function lineIndexOfSeq(seq) {
    var lo = 0, hi = state.lines.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (state.lines[mid].seq < seq) { lo = mid + 1; } else { hi = mid; }
    }
    return Math.min(lo, state.lines.length - 1);
  }

  // --- attempts --------------------------------------------------------------------------------
  function refreshAttemptOptions() {
    var have = el.attempt.options.length - 1;
    for (var n = have + 1; n <= state.maxAttempt; n++) {
      var option = document.createElement("option");
      option.value = String(n);
      option.textContent = "Attempt " + n;
      el.attempt.appendChild(option);
    }
  }

  function setAttemptFilter(attempt) {
    state.attemptFilter = attempt;
    el.attempt.value = attempt ? String(attempt) : "";
    keepingPlace(rebuild);
    state.renderKey = "";
    if (state.follow) { scrollToBottom(); }
    schedule();
  }

  // --- search ----------------------------------------------------------------------------------
  function searchResultItem(line) {
    var li = document.createElement("li");
    var link = document.createElement("a");
    link.href = "#L" + line.seq;
    link.setAttribute("data-seq", line.seq);
    var num = document.createElement("span");
    num.className = "lv-results__seq";
    num.textContent = "Line " + line.seq;
    var text = document.createElement("span");
    text.className = "lv-results__text";
    var shown = line.text.length > 240 ? line.text.slice(0, 240) + "…" : line.text;
    appendHighlighted(text, shown, state.query);
    link.appendChild(num);
    link.appendChild(text);
    li.appendChild(link);
    return li;
  }

  function renderResults() {
    el.results.hidden = false;
    el.clear.hidden = false;
    var n = state.matches.length;
    el.resultsSummary.textContent = n === 0
      ? "No lines contain “" + state.query + "”."
      : (state.matchesMore ? "First " + n + " lines that contain" : n === 1 ? "1 line contains" : n + " lines contain") + " “" + state.query + "”" +
        (state.matchIndex >= 0 ? " · match " + (state.matchIndex + 1) + " of " + n + (state.matchesMore ? "+" : "") : "") + ".";
    el.moreResults.hidden = !state.matchesMore;
    el.prev.disabled = el.next.disabled = n === 0;
    Array.prototype.forEach.call(el.resultsList.querySelectorAll("a[aria-current]"), function (a) { a.removeAttribute("aria-current"); });
    var current = state.matches[state.matchIndex];
    if (current) {
      var link = el.resultsList.querySelector('a[data-seq="' + current.seq + '"]');
      if (link) { link.setAttribute("aria-current", "true"); }
    }
  }

  function appendResults(lines) {
    var fragment = document.createDocumentFragment();
    lines.forEach(function (line) { fragment.appendChild(searchResultItem(line)); });
    el.resultsList.appendChild(fragment);
  }

  function search(query) {
    state.query = query;
    state.matches = []; state.matchIndex = -1; state.matchesMore = false; state.matchesNext = null;
    el.resultsList.textContent = "";
    state.version++;
    if (!query) {
      el.results.hidden = true; el.clear.hidden = true; el.prev.disabled = el.next.disabled = true;
      schedule();
      return;
    }
    el.resultsSummary.textContent = "Searching…";
    el.results.hidden = false;
    fetchPage({ after: 0, q: query, limit: SEARCH_PAGE }).then(function (page) {
      if (state.query !== query) { return; }
      state.matches = page.lines;
      state.matchesMore = page.has_more;
      state.matchesNext = page.next_after;
      appendResults(page.lines);
      renderResults();
      if (state.matches.length) { goToMatch(0); }
    }).catch(function (error) {
      el.resultsSummary.textContent = "Search failed (" + error.message + ").";
    });
    schedule();
  }

  function moreResults() {
    var query = state.query;
    fetchPage({ after: state.matchesNext, q: query, limit: SEARCH_PAGE }).then(function (page) {
      if (state.query !== query) { return; }
      state.matches = state.matches.concat(page.lines);
      state.matchesMore = page.has_more;
      state.matchesNext = page.next_after;
      appendResults(page.lines);
      renderResults();
    });
  }

  function goToMatch(index) {
    var n = state.matches.length;
    if (!n) { return; }
    state.matchIndex = (index + n) % n;
    renderResults();
    var seq = state.matches[state.matchIndex].seq;
    linkTo(seq);
  }

  function linkTo(seq) {
    if (window.history && window.history.replaceState) {
      window.history.replaceState(null, "", "#L" + seq);
    }
    goToSeq(seq);
  }

  // --- live updates ------------------------------------------------------------------------------
  function onLiveLines(lines) {
    if (!lines.length) { return; }
    var newest = lines[lines.length - 1].seq;
    if (state.atTail) {
      var before = state.totalUnits;
      var fresh = appendLines(lines);
      if (!state.follow) { state.newLines += fresh.length; }
      if (before !== state.totalUnits && state.follow) { scrollToBottom(); } else { schedule(); }
    } else {
      state.newLines += lines.filter(function (l) { return l.seq > state.liveSeq; }).length;
    }
    state.liveSeq = Math.max(state.liveSeq, newest);
    state.resumeKnown = true;
    setStatus();
  }

  function connect() {
    state.retryTimer = null;
    var params = new URLSearchParams({ stream: state.stream });
    if (state.resumeKnown) { params.set("after", String(state.liveSeq)); }
    var scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    var socket = new WebSocket(scheme + "//" + window.location.host + state.wsPath + "?" + params.toString());
    state.socket = socket;
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (state.conn !== "open") { state.conn = "open"; state.retries = 0; setStatus(); }
      if (message.type === "attempts") {
        var banners = message.banners || {};
        Object.keys(banners).forEach(function (k) { state.banners[k] = banners[k]; noteAttempt(parseInt(k, 10)); });
        state.version++;
        state.renderKey = "";
        schedule();
      } else if (message.type === "lines") {
        onLiveLines(message.lines || []);
      } else if (message.type === "end") {
        state.ended = true;
        state.endStatus = message.status || "finished";
        setStatus();
      }
    };
    socket.onclose = function (event) {
      if (state.socket !== socket) { return; }
      state.socket = null;
      if (state.ended) { return; }
      if (REFUSED[event.code]) {
        state.conn = "refused";
        state.refusedWhy = REFUSED[event.code];
        setStatus();
        return;
      }
      reconnectLater();
    };
  }

  function reconnectLater() {
    var delay = Math.min(30, Math.pow(2, state.retries)) * (0.8 + Math.random() * 0.4);
    state.retries++;
    state.conn = "reconnecting";
    state.retryIn = Math.max(1, Math.round(delay));
    setStatus();
    state.retryTimer = window.setTimeout(connect, delay * 1000);
  }

  // --- wiring ------------------------------------------------------------------------------------
  function readFallback() {
    var lines = [];
    if (!fallback) { return lines; }
    Array.prototype.forEach.call(fallback.querySelectorAll("li[data-seq]"), function (li) {
      var time = li.querySelector("time"), text = li.querySelector(".log__text");
      lines.push({
        seq: parseInt(li.getAttribute("data-seq"), 10),
        attempt: parseInt(li.getAttribute("data-attempt"), 10) || 1,
        ts: time ? time.getAttribute("datetime") : "",
        text: text ? text.textContent : ""
      });
    });
    return lines;
  }

  function seqFromHash() {
    var match = /^#L(\d+)$/.exec(window.location.hash);
    return match ? parseInt(match[1], 10) : null;
  }

  function applyWrap(on) {
    state.wrap = on;
    root.classList.toggle("lv--wrap", on);
    keepingPlace(function () { state.unitPx = state.baseUnitPx; rebuild(); });
    state.renderKey = "";
    if (state.follow) { scrollToBottom(); } else { schedule(); }
  }

  function applyTimestamps(on) {
    root.classList.toggle("lv--no-ts", !on);
    state.renderKey = "";
    schedule();
  }

  function start() {
    var initial = readFallback();
    if (fallback) { fallback.parentNode.removeChild(fallback); }
    root.hidden = false;
    var probe = parseFloat(window.getComputedStyle(root).getPropertyValue("--lv-row-h"));
    if (probe > 0) { state.baseUnitPx = state.unitPx = probe; }
    root.style.setProperty("--lv-vp-w", vp.clientWidth + "px");

    var streamForm = document.querySelector("[data-lv-stream-form]");
    if (streamForm) {
      var submit = streamForm.querySelector("[data-lv-stream-submit]");
      if (submit) { submit.hidden = true; }
      streamForm.querySelector("select").addEventListener("change", function () { streamForm.submit(); });
    }

    el.timestamps.checked = pref("timestamps", true);
    el.wrap.checked = pref("wrap", false);
    root.classList.toggle("lv--no-ts", !el.timestamps.checked);
    state.wrap = el.wrap.checked;
    root.classList.toggle("lv--wrap", state.wrap);

    replaceLines(initial);
    if (initial.length) {
      state.liveSeq = initial[initial.length - 1].seq;
      state.resumeKnown = true;
    }
    state.atTail = true;

    vp.addEventListener("scroll", function () {
      var top = vp.scrollTop;
      var programmatic = state.programmaticTop >= 0 && Math.abs(top - state.programmaticTop) < 2;
      state.programmaticTop = -1;
      if (!programmatic) { setFollow(state.atTail && isNearBottom()); }
      schedule();
    }, { passive: true });
    vp.addEventListener("keydown", function (event) {
      if (event.key === "Home" && !event.ctrlKey && !event.metaKey) { event.preventDefault(); jumpTop(); }
      if (event.key === "End" && !event.ctrlKey && !event.metaKey) { event.preventDefault(); jumpBottom(); }
    });
    vp.addEventListener("click", function (event) {
      var link = event.target.closest("a.lv-num");
      if (link) { event.preventDefault(); linkTo(parseInt(link.textContent, 10)); }
    });
    el.resultsList.addEventListener("click", function (event) {
      var link = event.target.closest("a[data-seq]");
      if (!link) { return; }
      event.preventDefault();
      var seq = parseInt(link.getAttribute("data-seq"), 10);
      state.matchIndex = state.matches.findIndex(function (l) { return l.seq === seq; });
      renderResults();
      linkTo(seq);
    });
    window.addEventListener("hashchange", function () {
      var seq = seqFromHash();
      if (seq) { goToSeq(seq); }
    });
    if (window.ResizeObserver) {
      new window.ResizeObserver(function () {
        root.style.setProperty("--lv-vp-w", vp.clientWidth + "px");
        state.renderKey = "";
        schedule();
      }).observe(vp);
    }

    el.follow.addEventListener("change", function () {
      if (el.follow.checked) { jumpBottom(); } else { setFollow(false); }
    });
    el.timestamps.addEventListener("change", function () { savePref("timestamps", el.timestamps.checked); applyTimestamps(el.timestamps.checked); });
    el.wrap.addEventListener("change", function () { savePref("wrap", el.wrap.checked); applyWrap(el.wrap.checked); });
    el.attempt.addEventListener("change", function () { setAttemptFilter(parseInt(el.attempt.value, 10) || 0); });
    el.top.addEventListener("click", jumpTop);
    el.bottom.addEventListener("click", jumpBottom);
    el.searchForm.addEventListener("submit", function (event) { event.preventDefault(); search(el.query.value.trim()); });
    el.clear.addEventListener("click", function () { el.query.value = ""; search(""); el.query.focus(); });
    el.prev.addEventListener("click", function () { goToMatch(state.matchIndex - 1); });
    el.next.addEventListener("click", function () { goToMatch(state.matchIndex + 1); });
    el.moreResults.addEventListener("click", moreResults);
    el.query.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && el.query.value) { el.query.value = ""; search(""); }
    });

    var target = seqFromHash();
    if (target) {
      goToSeq(target);
      root.scrollIntoView({ block: "start" });
    } else {
      scrollToBottom();
    }
    setStatus();
    connect();
  }

  start();
  // For tests and the browser console: what the viewer holds, and its navigation.
  root.logViewer = {
    loadedSeqs: function () { return state.lines.map(function (l) { return l.seq; }); },
    goToSeq: goToSeq, jumpTop: jumpTop, jumpBottom: jumpBottom
  };
})();
