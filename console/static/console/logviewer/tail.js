/* The live tail: what the socket's messages do to the viewer.
 *
 * Live lines join the segment only while it ends at the tail (`segment.atTail`), and scroll into
 * view while following; otherwise they are counted as new, and REST fetches them when the user
 * gets there. `segment.liveSeq` (the newest seq delivered) is where a reconnect resumes, so a
 * reconnect leaves no gap and the seq check drops duplicates.
 */
export function followTail({ transport, segment, rows, status, attempts, resumeKnown }) {
  function onLines(lines) {
    if (!lines.length) { return; }
    const newest = lines[lines.length - 1].seq;
    if (segment.atTail) {
      const before = segment.totalUnits;
      const fresh = rows.append(lines);
      if (!status.follow) { status.countNew(fresh.length); }
      if (before !== segment.totalUnits && status.follow) { rows.scrollToBottom(); } else { rows.schedule(); }
    } else {
      status.countNew(lines.filter((l) => l.seq > segment.liveSeq).length);
    }
    segment.liveSeq = Math.max(segment.liveSeq, newest);
    resumeKnown = true;
    status.show();
  }

  function onMessage(message) {
    if (message.type === "attempts") {
      attempts.setBanners(message.banners || {});
      rows.invalidate();
      rows.schedule();
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
