/* Search over the whole log (REST `q=`): the results list, Prev/Next through the matches, and the
 * query marked in the rows. Going to a match links to its line (#L<seq>). */
import { plainText } from "../format.js";
import { appendHighlighted } from "./markup.js";

const SEARCH_PAGE = 200;

export function initSearch({ el, fetchPage, rows, pages }) {
  let query = "";
  let matches = [], matchIndex = -1, matchesMore = false, matchesNext = null;

  function resultItem(line) {
    const li = document.createElement("li");
    const link = document.createElement("a");
    link.href = "#L" + line.seq;
    link.setAttribute("data-seq", line.seq);
    const num = document.createElement("span");
    num.className = "lv-results__seq";
    num.textContent = "Line " + line.seq;
    const text = document.createElement("span");
    text.className = "lv-results__text";
    const plain = plainText(line.text);
    const shown = plain.length > 240 ? plain.slice(0, 240) + "…" : plain;
    appendHighlighted(text, shown, query);
    link.appendChild(num);
    link.appendChild(text);
    li.appendChild(link);
    return li;
  }

  function renderResults() {
    el.results.hidden = false;
    el.clear.hidden = false;
    const n = matches.length;
    el.resultsSummary.textContent = n === 0
      ? "No lines contain “" + query + "”."
      : (matchesMore ? "First " + n + " lines that contain" : n === 1 ? "1 line contains" : n + " lines contain") + " “" + query + "”" +
        (matchIndex >= 0 ? " · match " + (matchIndex + 1) + " of " + n + (matchesMore ? "+" : "") : "") + ".";
    el.moreResults.hidden = !matchesMore;
    el.prev.disabled = el.next.disabled = n === 0;
    el.resultsList.querySelectorAll("a[aria-current]").forEach((a) => { a.removeAttribute("aria-current"); });
    const current = matches[matchIndex];
    if (current) {
      const link = el.resultsList.querySelector('a[data-seq="' + current.seq + '"]');
      if (link) { link.setAttribute("aria-current", "true"); }
    }
  }

  function appendResults(lines) {
    const fragment = document.createDocumentFragment();
    lines.forEach((line) => { fragment.appendChild(resultItem(line)); });
    el.resultsList.appendChild(fragment);
  }

  function search(text) {
    query = text;
    matches = []; matchIndex = -1; matchesMore = false; matchesNext = null;
    el.resultsList.textContent = "";
    rows.setQuery(text);
    rows.invalidate();
    if (!text) {
      el.results.hidden = true; el.clear.hidden = true; el.prev.disabled = el.next.disabled = true;
      rows.schedule();
      return;
    }
    el.resultsSummary.textContent = "Searching…";
    el.results.hidden = false;
    fetchPage({ after: 0, q: text, limit: SEARCH_PAGE }).then((page) => {
      if (query !== text) { return; }
      matches = page.lines;
      matchesMore = page.has_more;
      matchesNext = page.next_after;
      appendResults(page.lines);
      renderResults();
      if (matches.length) { goToMatch(0); }
    }).catch((error) => {
      el.resultsSummary.textContent = "Search failed (" + error.message + ").";
    });
    rows.schedule();
  }

  function moreResults() {
    const text = query;
    fetchPage({ after: matchesNext, q: text, limit: SEARCH_PAGE }).then((page) => {
      if (query !== text) { return; }
      matches = matches.concat(page.lines);
      matchesMore = page.has_more;
      matchesNext = page.next_after;
      appendResults(page.lines);
      renderResults();
    });
  }

  function goToMatch(index) {
    const n = matches.length;
    if (!n) { return; }
    matchIndex = (index + n) % n;
    renderResults();
    pages.linkTo(matches[matchIndex].seq);
  }

  el.searchForm.addEventListener("submit", (event) => { event.preventDefault(); search(el.query.value.trim()); });
  el.clear.addEventListener("click", () => { el.query.value = ""; search(""); el.query.focus(); });
  el.prev.addEventListener("click", () => { goToMatch(matchIndex - 1); });
  el.next.addEventListener("click", () => { goToMatch(matchIndex + 1); });
  el.moreResults.addEventListener("click", moreResults);
  el.query.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && el.query.value) { el.query.value = ""; search(""); }
  });
  el.resultsList.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-seq]");
    if (!link) { return; }
    event.preventDefault();
    const seq = parseInt(link.getAttribute("data-seq"), 10);
    matchIndex = matches.findIndex((l) => l.seq === seq);
    renderResults();
    pages.linkTo(seq);
  });
}
