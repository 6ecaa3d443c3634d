/* The job list's rows follow the jobs: when a job the page does not show appears, a shown one is
 * deleted, or (on a list filtered or sorted by status) a status changes, the list is re-read from
 * the server with the page's own querystring, so filters, sort and paging stay exactly as the
 * server applies them. At most one re-read is in flight; changes during it cause one more.
 * Rows already shown are kept as they are (moved, not re-rendered: the live messages and the
 * catch-up snapshot keep them current), so selections and anything watching them survive.
 */
const MIN_INTERVAL_MS = 700;

export function listRefresher(container, { onRefreshed = () => {} } = {}) {
  let inFlight = false;
  let again = false;
  let timer = null;
  let last = 0;

  function swap(fresh, selector) {
    const mine = document.querySelector(selector);
    const theirs = fresh.querySelector(selector);
    if (mine && theirs && mine.innerHTML !== theirs.innerHTML) { mine.innerHTML = theirs.innerHTML; }
  }

  // Rows of `fresh` in its order, reusing this page's row element for a job it already shows.
  function mergeRows(fresh) {
    const mine = container.querySelector("tbody");
    const theirs = fresh.querySelector("[data-live-jobs] tbody");
    if (!mine || !theirs) {
      const whole = fresh.querySelector("[data-live-jobs]");
      if (whole && container.innerHTML !== whole.innerHTML) { container.innerHTML = whole.innerHTML; }
      return;
    }
    const kept = new Map(Array.from(mine.querySelectorAll("tr[data-job-id]"), (tr) => [tr.getAttribute("data-job-id"), tr]));
    const wanted = Array.from(theirs.querySelectorAll("tr[data-job-id]"), (tr) => kept.get(tr.getAttribute("data-job-id")) || document.importNode(tr, true));
    const wantedSet = new Set(wanted);
    kept.forEach((tr) => { if (!wantedSet.has(tr)) { tr.remove(); } });
    wanted.forEach((tr, index) => {
      if (mine.children[index] !== tr) { mine.insertBefore(tr, mine.children[index] || null); }
    });
    const caption = container.querySelector("caption");
    const freshCaption = fresh.querySelector("[data-live-jobs] caption");
    if (caption && freshCaption) { caption.textContent = freshCaption.textContent; }
  }

  function run() {
    timer = null;
    if (inFlight) { again = true; return; }
    inFlight = true;
    last = performance.now();
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html", "X-Live-Refresh": "1" } })
      .then((response) => (response.ok ? response.text() : null))
      .then((html) => {
        if (!html) { return; }
        const fresh = new DOMParser().parseFromString(html, "text/html");
        const checked = new Set(Array.from(container.querySelectorAll('input[name="job_ids"]:checked'), (box) => box.value));
        mergeRows(fresh);
        swap(fresh, "[data-list-count]");
        swap(fresh, "[data-live-pagination]");
        container.querySelectorAll('input[name="job_ids"]').forEach((box) => { box.checked = checked.has(box.value); });
        const form = container.closest("form");
        if (form) { form.dispatchEvent(new Event("change", { bubbles: true })); }
        onRefreshed();
      })
      .catch(() => { /* the next change or reconnection tries again */ })
      .finally(() => {
        inFlight = false;
        if (again) { again = false; schedule(); }
      });
  }

  function schedule() {
    if (timer !== null) { return; }
    const wait = Math.max(50, MIN_INTERVAL_MS - (performance.now() - last));
    timer = window.setTimeout(run, wait);
  }

  function shows(id) {
    return container.querySelector('tr[data-job-id="' + id + '"]') !== null;
  }

  return {
    schedule,
    // A job's live message: does it change which rows this page holds?
    changesRows(job) {
      if (!shows(job.id)) { return true; }
      if (!container.hasAttribute("data-list-by-status")) { return false; }
      const row = container.querySelector('tr[data-job-id="' + job.id + '"]');
      return row.getAttribute("data-status") !== job.status;
    },
    shows
  };
}
