/* The viewer's controls: the stream selector, the Timestamps and Wrap toggles (remembered in
 * localStorage), Follow, the attempt filter, Top and Bottom (and Home/End on the lines), links
 * to a line (its number, or a #L<seq> address), and following that stops when the user scrolls up.
 */
import { seqFromHash } from "./pages.js";

function pref(name, fallbackValue) {
  try { const v = window.localStorage.getItem("logviewer." + name); return v === null ? fallbackValue : v === "1"; }
  catch (e) { return fallbackValue; }
}

function savePref(name, value) {
  try { window.localStorage.setItem("logviewer." + name, value ? "1" : "0"); } catch (e) { /* private mode */ }
}

export function initControls({ el, segment, rows, status, pages }) {
  // Picking a stream shows it at once; the Show button is for pages without JavaScript.
  const streamForm = document.querySelector("[data-lv-stream-form]");
  if (streamForm) {
    const submit = streamForm.querySelector("[data-lv-stream-submit]");
    if (submit) { submit.hidden = true; }
    streamForm.querySelector("select").addEventListener("change", () => { streamForm.submit(); });
  }

  // On a phone-sized screen lines wrap and timestamps hide by default (a line cut at 360 px says
  // nothing); a choice the user made is remembered and wins.
  const narrow = Boolean(window.matchMedia && window.matchMedia("(max-width: 640px)").matches);
  el.timestamps.checked = pref("timestamps", !narrow);
  el.wrap.checked = pref("wrap", narrow);
  rows.showTimestamps(el.timestamps.checked);
  rows.setWrap(el.wrap.checked);

  el.timestamps.addEventListener("change", () => {
    savePref("timestamps", el.timestamps.checked);
    rows.showTimestamps(el.timestamps.checked);
    rows.schedule();
  });
  el.wrap.addEventListener("change", () => {
    savePref("wrap", el.wrap.checked);
    rows.setWrap(el.wrap.checked);
    if (status.follow) { rows.scrollToBottom(); } else { rows.schedule(); }
  });
  el.follow.addEventListener("change", () => {
    if (el.follow.checked) { pages.jumpBottom(); } else { status.setFollow(false); }
  });
  el.attempt.addEventListener("change", () => { pages.setAttemptFilter(parseInt(el.attempt.value, 10) || 0); });
  el.top.addEventListener("click", pages.jumpTop);
  el.bottom.addEventListener("click", pages.jumpBottom);

  // Scrolling to the bottom of the tail follows again; scrolling away stops following.
  rows.onUserScroll((nearBottom) => { status.setFollow(segment.atTail && nearBottom); });
  el.viewport.addEventListener("keydown", (event) => {
    if (event.key === "Home" && !event.ctrlKey && !event.metaKey) { event.preventDefault(); pages.jumpTop(); }
    if (event.key === "End" && !event.ctrlKey && !event.metaKey) { event.preventDefault(); pages.jumpBottom(); }
  });
  el.viewport.addEventListener("click", (event) => {
    const link = event.target.closest("a.lv-num");
    if (link) { event.preventDefault(); pages.linkTo(parseInt(link.textContent, 10)); }
  });
  window.addEventListener("hashchange", () => {
    const seq = seqFromHash();
    if (seq) { pages.goToSeq(seq); }
  });
}
