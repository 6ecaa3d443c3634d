/* Text formatting shared by the console's scripts; the server's templates say the same things the
 * same way (jobs/templatetags/console_tags.py), so a value looks alike before and after a live update. */

export function pad(n, width = 2) {
  let s = String(n);
  while (s.length < width) { s = "0" + s; }
  return s;
}

// "45s", "3m 05s", "2h 03m 05s", "1d 2h 03m".
export function duration(totalSeconds) {
  let s = Math.max(0, Math.floor(totalSeconds));
  const days = Math.floor(s / 86400); s -= days * 86400;
  const hours = Math.floor(s / 3600); s -= hours * 3600;
  const minutes = Math.floor(s / 60); s -= minutes * 60;
  if (days) { return days + "d " + hours + "h " + pad(minutes) + "m"; }
  if (hours) { return hours + "h " + pad(minutes) + "m " + pad(s) + "s"; }
  if (minutes) { return minutes + "m " + pad(s) + "s"; }
  return s + "s";
}

// "UTC", "CET", "GMT+2": this browser's zone, as the server's pages name theirs.
function zoneName(d) {
  try {
    const part = new Intl.DateTimeFormat("en-GB", { timeZoneName: "short" }).formatToParts(d).find((p) => p.type === "timeZoneName");
    return part ? part.value : "";
  } catch (error) { return ""; }
}

// "2024-05-01 13:04:05 UTC" in this browser's time zone.
export function localTime(iso) {
  const d = new Date(iso);
  const zone = zoneName(d);
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + (zone ? " " + zone : "");
}

// "13:04:05.123" in this browser's time zone; "" for a time that does not parse.
export function clockTime(iso) {
  const d = new Date(iso);
  if (isNaN(d.getTime())) { return ""; }
  return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." + pad(d.getMilliseconds(), 3);
}

// Python's format(x, ".Ng"), near enough: 0.036, 5e-05, 1.234.
export function general(x, digits) {
  if (x === null || x === undefined) { return "—"; }
  const abs = Math.abs(x);
  if (abs !== 0 && (abs < 1e-4 || abs >= Math.pow(10, digits))) {
    const parts = x.toExponential(digits - 1).split("e");
    const mantissa = parts[0].indexOf(".") >= 0 ? parts[0].replace(/0+$/, "").replace(/\.$/, "") : parts[0];
    const exponent = parseInt(parts[1], 10);
    return mantissa + "e" + (exponent < 0 ? "-" : "+") + (Math.abs(exponent) < 10 ? "0" : "") + Math.abs(exponent);
  }
  return String(Number(x.toPrecision(digits)));
}

// "step 120/500 · epoch 1.2 · loss 0.036 · lr 5e-05", or "—".
export function progressText(p) {
  if (!p) { return "—"; }
  const parts = [];
  if (p.step !== null && p.step !== undefined) { parts.push("step " + p.step + (p.total ? "/" + p.total : "")); }
  if (p.epoch !== null && p.epoch !== undefined) { parts.push("epoch " + general(p.epoch, 4)); }
  if (p.loss !== null && p.loss !== undefined) { parts.push("loss " + general(p.loss, 4)); }
  if (p.lr !== null && p.lr !== undefined) { parts.push("lr " + general(p.lr, 3)); }
  return parts.join(" · ") || "—";
}

// "512 bytes", "1.5 KB", "2.0 GB" (a no-break space before the unit).
export function sizeText(bytes) {
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? bytes + " bytes" : value.toFixed(1) + "\u00a0" + units[unit];
}

// A log line as a page shows it: terminal control sequences out, their text kept (logs/terminal.py's
// plain_text, the same four patterns): tqdm's ESC[A, colours, titles, hyperlinks' targets, controls.
const TERMINAL_SEQUENCES = new RegExp([
  "(?:\\u001b\\[|\\u009b)[\\u0030-\\u003f]*[\\u0020-\\u002f]*[\\u0040-\\u007e]",
  "(?:\\u001b[\\]PX^_]|[\\u0090\\u0098\\u009d\\u009e\\u009f])[^\\u0007\\u001b\\u009c]*(?:\\u0007|\\u001b\\\\|\\u009c)",
  "\\u001b(?![\\[\\]PX^_])[\\u0020-\\u002f]*[\\u0030-\\u007e]",
  "[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]",
].join("|"), "g");

export function plainText(text) {
  return text.replace(TERMINAL_SEQUENCES, "");
}
