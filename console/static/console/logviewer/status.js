/* The status line under the viewer and the state it reports: following new lines or paused (and
 * how many arrived since), the live connection, the job's end, and the last page load's error. */

export function createStatus({ root, statusEl, newCountEl, followBox, segment }) {
  const status = {
    follow: true,
    newLines: 0,
    conn: "connecting", // connecting | open | reconnecting | refused
    retryIn: 0,
    refusedWhy: "",
    ended: false,
    endStatus: "",
    error: "",

    show() {
      let kind, text;
      if (status.ended) {
        kind = "ended"; text = "Ended: the job is " + status.endStatus + ". No more lines will come.";
      } else if (status.conn === "refused") {
        kind = "error"; text = "Live updates stopped: " + status.refusedWhy + ". Reload the page.";
      } else if (status.conn === "reconnecting") {
        kind = "reconnecting"; text = "Connection lost. Reconnecting in " + status.retryIn + " s, from line " + segment.liveSeq + ".";
      } else if (status.conn === "connecting") {
        kind = "connecting"; text = "Connecting…";
      } else if (status.follow) {
        kind = "following"; text = "Following new lines.";
      } else {
        kind = "paused"; text = "Paused: not following new lines. Press Bottom or End to follow.";
      }
      if (status.error) { text += " " + status.error; }
      statusEl.setAttribute("data-state", kind);
      root.setAttribute("data-state", kind);
      if (statusEl.textContent !== text) { statusEl.textContent = text; }
      newCountEl.textContent = !status.follow && status.newLines ? " (" + status.newLines + " new)" : "";
    },

    setFollow(on) {
      if (on === status.follow) { return; }
      status.follow = on;
      followBox.checked = on;
      if (on) { status.newLines = 0; }
      status.show();
    },

    setConnection(conn, { retryIn = 0, why = "" } = {}) {
      status.conn = conn;
      status.retryIn = retryIn;
      status.refusedWhy = why;
      status.show();
    },

    // Live lines that arrived while not following (shown on the Bottom button).
    countNew(count) { status.newLines += count; },
    clearNew() { status.newLines = 0; },

    // The last page load's error, told at the end of the status text from the next show().
    setError(text) { status.error = text; },

    setEnded(jobStatus) {
      status.ended = true;
      status.endStatus = jobStatus;
      status.show();
    }
  };
  return status;
}
