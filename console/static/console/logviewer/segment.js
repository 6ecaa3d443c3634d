/* The lines the viewer holds and their layout; no DOM.
 *
 * `lines` is one contiguous segment of the stream (ascending seq, at most MAX_LINES). `items` is
 * what the list shows of it: the lines that pass the attempt filter and, where the attempt changes
 * in seq order, a failover banner between them. `starts[i]` is item i's top in row units (a line
 * is one unit, a banner BANNER_UNITS), `totalUnits` the height of them all.
 * `liveSeq` is the newest seq the socket delivered (where a reconnect resumes); `atTail` says the
 * segment reaches it, so live lines join the segment. `version` changes with `items`.
 */
export const MAX_LINES = 50000;
const BANNER_UNITS = 2;

export function unitsOf(item) { return item.line ? 1 : BANNER_UNITS; }

export function createSegment(attempts) {
  let lastShown = null;

  const segment = {
    lines: [], hasOlder: false, atTail: true, liveSeq: 0,
    items: [], starts: [], totalUnits: 0, version: 0,

    last() { return segment.lines.length ? segment.lines[segment.lines.length - 1] : null; },

    rebuild() {
      segment.items = []; segment.starts = []; segment.totalUnits = 0; lastShown = null;
      for (let i = 0; i < segment.lines.length; i++) { show(segment.lines[i]); }
      segment.version++;
    },

    // Adds the lines newer than the last one held; returns those.
    append(lines) {
      const last = segment.last();
      const fresh = last ? lines.filter((l) => l.seq > last.seq) : lines.slice();
      if (!fresh.length) { return fresh; }
      if (!segment.lines.length) { segment.hasOlder = fresh[0].seq > 1; }
      for (let i = 0; i < fresh.length; i++) {
        segment.lines.push(fresh[i]);
        attempts.note(fresh[i].attempt);
        show(fresh[i]);
      }
      segment.version++;
      return fresh;
    },

    isOverfull() { return segment.lines.length > MAX_LINES; },

    // Beyond MAX_LINES the oldest lines go.
    keepNewest() {
      if (segment.lines.length > MAX_LINES) {
        segment.lines = segment.lines.slice(segment.lines.length - MAX_LINES);
        segment.hasOlder = true;
      }
      segment.rebuild();
    },

    replace(lines) {
      segment.lines = lines.slice();
      segment.hasOlder = lines.length ? lines[0].seq > 1 : false;
      lines.forEach((l) => { attempts.note(l.attempt); });
      segment.rebuild();
    },

    // Older lines before the first one held; beyond MAX_LINES the newest lines go.
    prepend(older) {
      older.forEach((l) => { attempts.note(l.attempt); });
      segment.lines = older.concat(segment.lines);
      if (segment.lines.length > MAX_LINES) {
        segment.lines.length = MAX_LINES;
        segment.atTail = false;
      }
      segment.rebuild();
    },

    // Newer lines after the last one held (from REST); beyond MAX_LINES the oldest lines go.
    extend(newer) {
      newer.forEach((l) => { attempts.note(l.attempt); });
      segment.lines = segment.lines.concat(newer);
      segment.keepNewest();
    },

    // Drops the lines from `seq` on (late lines of an ended attempt went in there, and the
    // lines after them moved up); the socket or REST brings them again.
    dropFrom(seq) {
      segment.lines = segment.lines.filter((l) => l.seq < seq);
      segment.rebuild();
    },

    // The first item whose seq is >= seq, skipping to the line when it lands on a banner.
    itemIndexOfSeq(seq) {
      const items = segment.items;
      let lo = 0, hi = items.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (items[mid].seq < seq) { lo = mid + 1; } else { hi = mid; }
      }
      if (lo >= items.length) { return items.length - 1; }
      if (items[lo].banner && lo + 1 < items.length) { lo++; }
      return lo;
    },

    indexAtUnit(unit) {
      const starts = segment.starts;
      let lo = 0, hi = starts.length - 1;
      if (hi < 0) { return 0; }
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= unit) { lo = mid; } else { hi = mid - 1; }
      }
      return lo;
    },

    // The line with this seq, or null where the segment does not hold it.
    lineOfSeq(seq) {
      const lines = segment.lines;
      if (!lines.length || seq < lines[0].seq || seq > lines[lines.length - 1].seq) { return null; }
      let lo = 0, hi = lines.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (lines[mid].seq < seq) { lo = mid + 1; } else { hi = mid; }
      }
      return lines[Math.min(lo, lines.length - 1)];
    }
  };

  function addItem(item) {
    segment.items.push(item);
    segment.starts.push(segment.totalUnits);
    segment.totalUnits += unitsOf(item);
  }

  function show(line) {
    if (attempts.filter && line.attempt !== attempts.filter) { return; }
    if (!attempts.filter && lastShown && lastShown.attempt !== line.attempt) {
      addItem({ banner: true, attempt: line.attempt, seq: line.seq });
    }
    addItem({ line, seq: line.seq });
    lastShown = line;
  }

  return segment;
}
