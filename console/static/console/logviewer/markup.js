/* The elements of the viewer's rows, built from data; no state. */
import { clockTime, plainText } from "../format.js";

// `text` into `parent`, each case-insensitive occurrence of `query` in a <mark>.
export function appendHighlighted(parent, text, query) {
  if (!query) { parent.textContent = text; return; }
  const lower = text.toLowerCase(), needle = query.toLowerCase();
  let from = 0, at;
  while ((at = lower.indexOf(needle, from)) !== -1) {
    if (at > from) { parent.appendChild(document.createTextNode(text.slice(from, at))); }
    const mark = document.createElement("mark");
    mark.textContent = text.slice(at, at + needle.length);
    parent.appendChild(mark);
    from = at + needle.length;
  }
  if (from < text.length) { parent.appendChild(document.createTextNode(text.slice(from))); }
}

function timeText(line) {
  if (line.timeText === undefined) { line.timeText = clockTime(line.ts); }
  return line.timeText;
}

// A failover banner (role="note") between the lines of two attempts.
export function bannerRow(item, bannerText) {
  const row = document.createElement("div");
  row.className = "lv-banner";
  row.setAttribute("role", "note");
  row.setAttribute("data-attempt", item.attempt);
  row.innerHTML = '<svg class="icon" aria-hidden="true" focusable="false"><use href="#icon-refresh"></use></svg>';
  const label = document.createElement("strong");
  label.textContent = "Failover · attempt " + item.attempt + ": ";
  const text = document.createElement("span");
  text.className = "lv-banner__text";
  text.textContent = bannerText;
  row.title = text.textContent;
  row.appendChild(label);
  row.appendChild(text);
  return row;
}

// A log line: its number (a link to the line), time and text with the search query marked.
export function lineRow(line, { isTarget, query }) {
  const row = document.createElement("div");
  row.className = "lv-row";
  if (isTarget) { row.className += " is-target"; }
  row.setAttribute("data-seq", line.seq);
  row.setAttribute("data-attempt", line.attempt);
  const num = document.createElement("a");
  num.className = "lv-num";
  num.href = "#L" + line.seq;
  num.tabIndex = -1;
  num.textContent = line.seq;
  num.title = "Link to line " + line.seq;
  const time = document.createElement("time");
  time.className = "lv-ts";
  time.dateTime = line.ts;
  time.textContent = timeText(line);
  const text = document.createElement("span");
  text.className = "lv-text";
  appendHighlighted(text, plainText(line.text), query);
  row.appendChild(num);
  row.appendChild(time);
  row.appendChild(text);
  return row;
}
