/* The Nodes page follows faults and health: every few seconds while the tab is visible it re-reads
 * the page and replaces each node's tags, actions, GPU table and job/fault list ([data-node-region])
 * whose HTML changed. The fault form is never replaced, so what an operator types stays.
 */
const INTERVAL_MS = 2000;
const state = document.querySelector("[data-nodes-live]");
let busy = false;

function show(text, kind) {
  if (!state) { return; }
  state.hidden = false;
  state.textContent = text;
  state.className = "live-state live-state--" + kind;
}

function refresh() {
  if (busy || document.hidden) { return; }
  busy = true;
  fetch(window.location.pathname, { credentials: "same-origin", headers: { Accept: "text/html", "X-Live-Refresh": "1" } })
    .then((response) => {
      if (!response.ok) { throw new Error(String(response.status)); }
      return response.text();
    })
    .then((html) => {
      const fresh = new DOMParser().parseFromString(html, "text/html");
      document.querySelectorAll("section[data-node]").forEach((section) => {
        const theirs = fresh.querySelector('section[data-node="' + CSS.escape(section.getAttribute("data-node")) + '"]');
        if (!theirs) { return; }
        section.querySelectorAll("[data-node-region]").forEach((region) => {
          const other = theirs.querySelector('[data-node-region="' + region.getAttribute("data-node-region") + '"]');
          if (other && other.innerHTML !== region.innerHTML && !region.contains(document.activeElement)) { region.innerHTML = other.innerHTML; }
        });
      });
      show("Live", "on");
    })
    .catch(() => { show("Reconnecting…", "retry"); })
    .finally(() => { busy = false; });
}

if (document.querySelector("section[data-node]")) {
  show("Live", "on");
  window.setInterval(refresh, INTERVAL_MS);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) { refresh(); } });
}
