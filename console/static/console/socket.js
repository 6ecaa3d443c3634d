/* The one reconnecting WebSocket of the console: every live socket (job pages, log viewer) uses it.
 *
 * connect(path, { onMessage, onState }) opens ws(s)://<this host><path> and keeps it open:
 * - `path` is a string, or a function called on each (re)connection (a resume point can change).
 * - onMessage(message) gets each message's JSON; a message that is not JSON is dropped.
 * - onState(state, detail) hears "open" (the first message of a connection: the server is
 *   answering, so the backoff starts again from 1 s), "reconnecting" ({ seconds } until the next
 *   try) and "refused" ({ code, why }: the server said no, so it never retries).
 * After a lost connection it retries after 1 s, doubling to 30 s, each delay ±20% so that many
 * pages do not come back at the same moment. Coming back online or to the tab retries at once;
 * leaving the page closes the socket (the page can enter the back/forward cache) and coming back
 * to it reconnects. The returned handle's stop() closes the socket for good.
 */
export const REFUSED = { 4400: "the request was refused", 4401: "you are signed out", 4403: "your access was revoked", 4404: "the job is not found" };
const MAX_DELAY_S = 30;

function socketUrl(path) {
  return (window.location.protocol === "https:" ? "wss:" : "ws:") + "//" + window.location.host + path;
}

export function connect(path, { onMessage, onState = () => {} }) {
  let socket = null;
  let retryTimer = null;
  let failures = 0;
  let stopped = false;

  function open() {
    retryTimer = null;
    let answered = false;
    const current = new WebSocket(socketUrl(typeof path === "function" ? path() : path));
    socket = current;
    current.onmessage = (event) => {
      let message;
      try { message = JSON.parse(event.data); } catch (error) { return; }
      if (!answered) {
        answered = true;
        failures = 0;
        onState("open", {});
      }
      onMessage(message);
    };
    current.onclose = (event) => {
      if (socket !== current) { return; }
      socket = null;
      if (stopped) { return; }
      if (REFUSED[event.code]) {
        stopped = true;
        onState("refused", { code: event.code, why: REFUSED[event.code] });
        return;
      }
      retryLater();
    };
  }

  function retryLater() {
    if (retryTimer !== null) { return; }
    const seconds = Math.min(MAX_DELAY_S, Math.pow(2, failures)) * (0.8 + Math.random() * 0.4);
    failures += 1;
    onState("reconnecting", { seconds });
    retryTimer = window.setTimeout(open, seconds * 1000);
  }

  function retryNow() {
    if (!stopped && socket === null && retryTimer !== null) {
      window.clearTimeout(retryTimer);
      open();
    }
  }

  function closeQuietly() {
    if (socket) {
      const closing = socket;
      socket = null;
      closing.onclose = null;
      closing.close();
    }
  }

  window.addEventListener("online", retryNow);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) { retryNow(); } });
  window.addEventListener("pagehide", closeQuietly);
  window.addEventListener("pageshow", (event) => {
    if (event.persisted && !stopped && socket === null && retryTimer === null) { open(); }
  });

  open();
  return {
    stop() {
      stopped = true;
      window.clearTimeout(retryTimer);
      retryTimer = null;
      closeQuietly();
    }
  };
}
