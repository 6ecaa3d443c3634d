/* The live tail: what the socket's messages do to the viewer.
 *
 * Live lines join the segment only while it ends at the tail (`segment.atTail`), and scroll into
 * view while following; otherwise they are counted as new, and REST fetches them when the user
 * gets there. `segment.liveSeq` (the newest seq delivered) is where a reconnect resumes, so a
 * reconnect leaves no gap and the seq check drops duplicates. While following, the newest lines
 * are in view even once the segment holds MAX_LINES (its oldest lines go); while paused, a full
 * segment keeps the lines being read and stops at the tail instead.
 */
import { MAX_LINES } from "./segment.js";

export function followTail({ transport, segment, rows, status, attempts, resumeKnown }) {
  function onLines(lines) {
    if (!lines.length) { return; }
    const newest = lines[lines.length - 1].seq;
    if (segment.atTail && !status.follow && segment.lines.length + lines.length > MAX_LINES) {
      // Paused with a full segment: the lines being read stay; the new ones are counted, and
      // REST brings them when the reader gets to the end (or presses Bottom).
      segment.atTail = false;
    }
    if (segment.atTail) {
      // While following, every fresh line scrolls into view, also once the segment is full and
      // its oldest lines go as new ones come (its height no longer changes then).
      const fresh = rows.append(lines, { keepPlace: !status.follow });
      if (!status.follow) { status.countNew(fresh.length); }
      if (fresh.length && status.follow) { rows.scrollToBottom(); } else { rows.schedule(); }
    } else {
      status.countNew(lines.filter((l) => l.seq > segment.liveSeq).length);
    }
    segment.liveSeq = Math.max(segment.liveSeq, newest);
    resumeKnown = true;
    status.show();
  }

  // Late lines of an ended attempt were stored in that attempt's place, at `fromSeq`, and the
  // lines from there on moved up: what the segment holds from there goes, and the socket's next
  // lines bring it again (while at the tail; otherwise REST, when the reader gets there).
  function onInserted(fromSeq) {
    if (!(fromSeq > 0)) { return; }
    segment.liveSeq = Math.min(segment.liveSeq, fromSeq - 1);
    const last = segment.last();
    if (!last || last.seq < fromSeq) { return; }
    if (segment.lines[0].seq >= fromSeq) { segment.atTail = true; }
    rows.keepingPlace(() => { segment.dropFrom(fromSeq); });
    rows.invalidate();
    rows.schedule();
  }

  function onMessage(message) {
    if (message.type === "attempts") {
      attempts.setBanners(message.banners || {});
      rows.invalidate();
      rows.schedule();
    } else if (message.type === "inserted") {
      onInserted(message.from_seq);
    } else if (message.type === "lines") {
      onLines(message.lines || []);
    } else if (message.type === "end") {
      // The server closes the socket after this message: nothing to reconnect to.
      live.stop();
      status.setEnded(message.status || "finished");
    }
  }

  function onState(state, detail) {
    if (state === "reconnecting") {
      status.setConnection("reconnecting", { retryIn: Math.max(1, Math.round(detail.seconds)) });
    } else {
      status.setConnection(state, { why: detail.why });
    }
  }

  const live = transport.openLive({ resumeAfter: () => (resumeKnown ? segment.liveSeq : null), onMessage, onState });
  return live;
}
