/* The virtual list: only the segment's items in view (plus OVERSCAN) exist in the DOM.
 *
 * The canvas is as tall as every item would be; the rendered rows sit at their place in it. Rows
 * are a fixed height (--lv-row-h) when wrap is off; with wrap on, the unit height is an estimate
 * measured from the rendered rows. Rendering happens once per animation frame (schedule); after
 * each frame the onFrame listeners run (the pager fetches the next page near an edge).
 * Changes to the segment go through append/replace/keepingPlace so the canvas follows them.
 */
import { unitsOf } from "./segment.js";
import { bannerRow, lineRow } from "./markup.js";

const OVERSCAN = 30; // rows rendered above and below the visible ones

export function createRows({ root, viewport: vp, canvas, rowsEl, emptyEl, segment, attempts }) {
  let unitPx = 20, baseUnitPx = 20, wrap = false;
  let renderKey = "", frame = 0, programmaticTop = -1;
  let busy = false, targetSeq = null, query = "";
  const frameListeners = [];
  const userScrollListeners = [];

  const probe = parseFloat(window.getComputedStyle(root).getPropertyValue("--lv-row-h"));
  if (probe > 0) { baseUnitPx = unitPx = probe; }
  root.style.setProperty("--lv-vp-w", vp.clientWidth + "px");

  function updateCanvas() {
    canvas.style.height = Math.ceil(segment.totalUnits * unitPx) + "px";
  }

  function setScrollTop(y) {
    vp.scrollTop = Math.max(0, y);
    programmaticTop = vp.scrollTop;
  }

  // Keeps the line at the top of the view where it is across a change of the segment.
  function keepingPlace(change) {
    let anchor = null;
    if (segment.items.length) {
      let i = segment.indexAtUnit(vp.scrollTop / unitPx);
      while (i < segment.items.length && !segment.items[i].line) { i++; }
      if (i < segment.items.length) { anchor = { seq: segment.items[i].seq, delta: segment.starts[i] * unitPx - vp.scrollTop }; }
    }
    change();
    updateCanvas();
    if (anchor && segment.items.length) {
      const j = segment.itemIndexOfSeq(anchor.seq);
      setScrollTop(segment.starts[j] * unitPx - anchor.delta);
    }
  }

  function schedule() {
    if (!frame) {
      frame = window.requestAnimationFrame(() => {
        frame = 0;
        render();
        frameListeners.forEach((listener) => { listener(); });
      });
    }
  }

  function render() {
    emptyEl.hidden = segment.lines.length > 0 || busy;
    const items = segment.items, starts = segment.starts, count = items.length;
    if (!count) {
      if (rowsEl.firstChild) { rowsEl.textContent = ""; }
      renderKey = "";
      return;
    }
    const top = vp.scrollTop, height = vp.clientHeight || 400;
    const first = segment.indexAtUnit(Math.floor(top / unitPx));
    // Enough rows to fill the view even if every row is only the base height (wrap mode).
    const lastVisible = Math.min(count - 1, first + Math.ceil(height / baseUnitPx));
    const start = Math.max(0, first - OVERSCAN);
    const end = Math.min(count, lastVisible + OVERSCAN + 1);
    const key = start + ":" + end + ":" + segment.version + ":" + unitPx;
    if (key === renderKey) { return; }
    renderKey = key;
    const fragment = document.createDocumentFragment();
    for (let i = start; i < end; i++) {
      const item = items[i];
      fragment.appendChild(item.line
        ? lineRow(item.line, { isTarget: item.line.seq === targetSeq, query })
        : bannerRow(item, attempts.bannerText(item.attempt)));
    }
    rowsEl.style.transform = "translateY(" + Math.round(starts[start] * unitPx) + "px)";
    rowsEl.textContent = "";
    rowsEl.appendChild(fragment);
    if (wrap) { measureWrappedRows(start, end); }
  }

  // With wrap on, rows differ in height: the unit becomes the rendered rows' average.
  function measureWrappedRows(start, end) {
    const units = segment.starts[end - 1] - segment.starts[start] + unitsOf(segment.items[end - 1]);
    const measured = rowsEl.offsetHeight / Math.max(units, 1);
    if (measured > 0 && Math.abs(measured - unitPx) / unitPx > 0.15) {
      keepingPlace(() => { unitPx = Math.max(baseUnitPx, measured); });
      renderKey = "";
      schedule();
    }
  }

  function isNearBottom() {
    return vp.scrollTop + vp.clientHeight >= vp.scrollHeight - baseUnitPx * 1.5;
  }

  function scrollToBottom() {
    updateCanvas();
    setScrollTop(vp.scrollHeight);
    render();
    if (wrap) { setScrollTop(vp.scrollHeight); render(); }
  }

  function scrollToTop() {
    setScrollTop(0);
    renderKey = "";
    render();
  }

  function centerOn(seq) {
    if (!segment.items.length) { return; }
    updateCanvas();
    const i = segment.itemIndexOfSeq(seq);
    setScrollTop(segment.starts[i] * unitPx - (vp.clientHeight - unitPx) / 2);
    renderKey = "";
    render();
    const row = rowsEl.querySelector('.lv-row[data-seq="' + seq + '"]');
    if (row && wrap) {
      const offset = row.getBoundingClientRect().top - vp.getBoundingClientRect().top;
      setScrollTop(vp.scrollTop + offset - (vp.clientHeight - row.offsetHeight) / 2);
      render();
    }
  }

  vp.addEventListener("scroll", () => {
    const programmatic = programmaticTop >= 0 && Math.abs(vp.scrollTop - programmaticTop) < 2;
    programmaticTop = -1;
    if (!programmatic) { userScrollListeners.forEach((listener) => { listener(isNearBottom()); }); }
    schedule();
  }, { passive: true });
  if (window.ResizeObserver) {
    new window.ResizeObserver(() => {
      root.style.setProperty("--lv-vp-w", vp.clientWidth + "px");
      renderKey = "";
      schedule();
    }).observe(vp);
  }

  return {
    schedule, render, keepingPlace, scrollToBottom, scrollToTop, centerOn,

    // The next render draws every row again (the marks, banner texts or target changed).
    invalidate() { renderKey = ""; },
    onFrame(listener) { frameListeners.push(listener); },
    // listener(nearBottom) hears scrolling that this list did not do itself.
    onUserScroll(listener) { userScrollListeners.push(listener); },

    replace(lines) { segment.replace(lines); updateCanvas(); },

    // Live lines at the end of the segment; returns those it did not hold yet. Where the segment
    // overflows, its oldest lines go: with keepPlace the lines in view stay where they are.
    append(lines, { keepPlace = true } = {}) {
      const fresh = segment.append(lines);
      if (!fresh.length) { return fresh; }
      if (segment.isOverfull()) { if (keepPlace) { keepingPlace(segment.keepNewest); } else { segment.keepNewest(); } }
      updateCanvas();
      return fresh;
    },

    setWrap(on) {
      wrap = on;
      root.classList.toggle("lv--wrap", on);
      keepingPlace(() => { unitPx = baseUnitPx; segment.rebuild(); });
      renderKey = "";
    },
    showTimestamps(on) {
      root.classList.toggle("lv--no-ts", !on);
      renderKey = "";
    },
    setBusy(on) {
      busy = on;
      root.classList.toggle("is-loading", on);
      vp.setAttribute("aria-busy", on ? "true" : "false");
    },
    setTarget(seq) { targetSeq = seq; },
    setQuery(text) { query = text; },

    // Within `count` rows of the top or of the bottom of the canvas.
    nearTop(count) { return vp.scrollTop < count * unitPx; },
    nearEnd(count) { return vp.scrollTop + vp.clientHeight > vp.scrollHeight - count * unitPx; }
  };
}
