/* Moving through the log over REST: the page before or after the segment when the view nears its
 * edge, Top (`after=0`), Bottom (the tail page, `before=<big>`), a line (`after=<seq-AROUND>`,
 * centred and marked) and the attempt filter. One navigation at a time: a newer navigation makes
 * the answers to older requests stale.
 */
const PAGE = 1000;          // lines per REST page
const AROUND = 500;         // a #L<seq> link loads from seq - AROUND
const LOAD_MARGIN = 40;     // rows from an edge at which the next page is fetched
const TAIL_BEFORE = "999999999999999";

// The line a #L<seq> address points at, or null.
export function seqFromHash() {
  const match = /^#L(\d+)$/.exec(window.location.hash);
  return match ? parseInt(match[1], 10) : null;
}

export function createPages({ fetchPage, segment, rows, status, attempts }) {
  let generation = 0;
  let loading = false;

  function setLoading(on) {
    loading = on;
    rows.setBusy(on);
  }

  function load(params, apply, navigation) {
    const asked = navigation ? ++generation : generation;
    setLoading(true);
    return fetchPage(params).then((page) => {
      if (asked !== generation) { return; }
      status.setError("");
      apply(page);
    }).catch((error) => {
      if (asked !== generation) { return; }
      status.setError("Could not load log lines (" + error.message + ").");
    }).then(() => {
      if (asked === generation) { setLoading(false); }
      status.show();
      rows.schedule();
    });
  }

  function reachedTailIfDone(page) {
    const last = segment.last();
    segment.atTail = !page.has_more && (!last || last.seq >= segment.liveSeq);
  }

  function loadOlder() {
    const first = segment.lines[0];
    load({ before: first.seq, limit: PAGE }, (page) => {
      segment.hasOlder = page.has_more;
      const older = page.lines.filter((l) => l.seq < first.seq);
      if (!older.length) { return; }
      rows.keepingPlace(() => { segment.prepend(older); });
    });
  }

  function loadNewer() {
    const last = segment.last();
    load({ after: last.seq, limit: PAGE }, (page) => {
      const fresh = page.lines.filter((l) => l.seq > last.seq);
      rows.keepingPlace(() => { segment.extend(fresh); });
      reachedTailIfDone(page);
    });
  }

  function maybeLoad() {
    if (loading || !segment.lines.length) { return; }
    if (segment.hasOlder && rows.nearTop(LOAD_MARGIN)) {
      loadOlder();
    } else if (!segment.atTail && rows.nearEnd(LOAD_MARGIN)) {
      loadNewer();
    }
  }

  function setAttemptFilter(attempt) {
    attempts.setFilter(attempt);
    rows.keepingPlace(segment.rebuild);
    rows.invalidate();
    if (status.follow) { rows.scrollToBottom(); }
    rows.schedule();
  }

  function jumpTop() {
    status.setFollow(false);
    rows.setTarget(null);
    load({ after: 0, limit: PAGE }, (page) => {
      rows.replace(page.lines);
      segment.hasOlder = false;
      reachedTailIfDone(page);
      rows.scrollToTop();
    }, true);
  }

  function jumpBottom() {
    status.clearNew();
    rows.setTarget(null);
    if (segment.atTail) {
      generation++;
      setLoading(false);
      status.setFollow(true);
      rows.invalidate();
      rows.scrollToBottom();
      status.show();
      return;
    }
    status.setFollow(true);
    load({ before: TAIL_BEFORE, limit: PAGE }, (page) => {
      rows.replace(page.lines);
      segment.hasOlder = page.has_more;
      const last = segment.last();
      segment.atTail = !last || last.seq >= segment.liveSeq;
      rows.invalidate();
      rows.scrollToBottom();
    }, true);
  }

  function goToSeq(seq) {
    if (!(seq > 0)) { return; }
    status.setFollow(false);
    rows.setTarget(seq);
    rows.invalidate();
    const target = segment.lineOfSeq(seq);
    if (target && attempts.filter && target.attempt !== attempts.filter) {
      setAttemptFilter(0);
    }
    if (target) {
      rows.centerOn(seq);
      status.show();
      return;
    }
    if (attempts.filter) { setAttemptFilter(0); }
    load({ after: Math.max(seq - AROUND, 0), limit: PAGE }, (page) => {
      rows.replace(page.lines);
      reachedTailIfDone(page);
      rows.centerOn(seq);
    }, true);
  }

  // Puts #L<seq> in the address (a link to share) and goes to that line.
  function linkTo(seq) {
    if (window.history && window.history.replaceState) {
      window.history.replaceState(null, "", "#L" + seq);
    }
    goToSeq(seq);
  }

  rows.onFrame(maybeLoad);
  return { jumpTop, jumpBottom, goToSeq, linkTo, setAttemptFilter };
}
