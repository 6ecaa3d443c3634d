/* The log's two ways in: REST pages (`<api>?stream=&after=|before=|q=&limit=`) and the live
 * socket (`<ws path>?stream=&after=<seq>`), which reconnects through the shared socket.js. */
import { connect } from "../socket.js";

export function createTransport({ api, wsPath, stream }) {
  function fetchPage(params) {
    const query = new URLSearchParams({ stream });
    Object.keys(params).forEach((k) => { query.set(k, params[k]); });
    return window.fetch(api + "?" + query.toString(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      });
  }

  // resumeAfter() is asked on each (re)connection: the seq to resume after, or null for the tail.
  function openLive({ resumeAfter, onMessage, onState }) {
    return connect(() => {
      const params = new URLSearchParams({ stream });
      const after = resumeAfter();
      if (after !== null) { params.set("after", String(after)); }
      return wsPath + "?" + params.toString();
    }, { onMessage, onState });
  }

  return { fetchPage, openLive };
}
