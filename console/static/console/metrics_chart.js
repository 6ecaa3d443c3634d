/* A job's GPU and host usage over time on its Details tab (vendored uPlot), with markers where an
 * attempt started (a failover or a resume) and where a checkpoint was committed.
 *
 * The page embeds the samples (json_script "metrics-samples") and the markers ("chart-markers");
 * while the job runs the chart re-reads /api/v1/training-jobs/<id>/metrics/ every few seconds
 * (plain HTTP: the console's only sockets are socket.js's).
 *
 * x is in seconds (uPlot's time scales count seconds). The line breaks (a null point) between two
 * attempts and wherever samples lie farther apart than a few sampling intervals, so the time a job
 * waited (Pending, a failover) never reads as a busy GPU. The x range is the samples' own span, at
 * least MIN_SPAN_S wide: left to itself uPlot widens a single point by 86,400,000 (a day in ms,
 * read as seconds), and a 6-second job's axis spanned years. The figure's ``metricsChart`` is the uPlot instance.
 */
(function () {
  "use strict";

  var figure = document.querySelector("[data-metrics-chart]");
  if (!figure || typeof window.uPlot !== "function") { return; }
  var plot = figure.querySelector("[data-metrics-plot]");
  var empty = figure.querySelector("[data-metrics-empty]");
  var header = document.querySelector("[data-live-job]");
  var POLL_MS = 3000;
  var GAP_INTERVALS = 3;
  var MIN_SPAN_S = 30;
  var interval = Number(figure.getAttribute("data-sample-interval")) || 5;
  var chart = null;
  var samples = [];

  function parse(id) {
    var el = document.getElementById(id);
    try { return el ? JSON.parse(el.textContent) : null; } catch (error) { return null; }
  }

  function markers() { return parse("chart-markers") || { attempts: [], checkpoints: [] }; }

  function seconds(sample) { return Date.parse(sample.ts) / 1000; }
  function spanOf(sample) { return Math.max(Number(sample.span_s) || 0, interval); }

  // Two samples that do not follow one another: another attempt, or a gap no sampling explains.
  function breaksBetween(a, b) {
    return a.attempt !== b.attempt || seconds(b) - seconds(a) > GAP_INTERVALS * Math.max(spanOf(a), spanOf(b));
  }

  function columns() {
    var xs = [], util = [], cpu = [], power = [], gmem = [], hmem = [];
    var all = [xs, util, cpu, power, gmem, hmem];
    samples.forEach(function (s, index) {
      var previous = index ? samples[index - 1] : null;
      if (previous && breaksBetween(previous, s)) {
        all.forEach(function (column, n) { column.push(n ? null : (seconds(previous) + seconds(s)) / 2); });
      }
      xs.push(seconds(s));
      util.push(s.gpu_util);
      cpu.push(s.cpu_percent);
      power.push(s.power_w);
      gmem.push(s.gpu_mem_mb === null ? null : s.gpu_mem_mb / 1024);
      hmem.push(s.host_mem_mb === null ? null : s.host_mem_mb / 1024);
    });
    return all;
  }

  // From the samples, not uPlot's min and max: for a single point it offers a day in milliseconds.
  function xRange(u, min, max) {
    if (!samples.length) { return [min, max]; }
    var low = seconds(samples[0]) - spanOf(samples[0]);
    var high = seconds(samples[samples.length - 1]);
    if (high - low < MIN_SPAN_S) {
      var pad = (MIN_SPAN_S - (high - low)) / 2;
      low -= pad;
      high += pad;
    }
    return [low, high];
  }

  // Vertical lines: attempt starts (red, dashed after the first) and checkpoint commits (green).
  function drawMarkers(u) {
    var m = markers();
    var ctx = u.ctx;
    var top = u.bbox.top, height = u.bbox.height;
    function line(seconds, colour, dash) {
      var x = Math.round(u.valToPos(seconds, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) { return; }
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
      ctx.setLineDash(dash);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      ctx.restore();
    }
    (m.checkpoints || []).forEach(function (c) { line(Date.parse(c.at) / 1000, "rgba(23, 103, 58, .55)", [2, 3]); });
    (m.attempts || []).forEach(function (a) { if (a.number > 1 && a.started_at) { line(Date.parse(a.started_at) / 1000, "#b42318", [6, 4]); } });
  }

  function width() { return Math.max(240, plot.clientWidth || figure.clientWidth || 600); }

  function draw() {
    if (!samples.length) { return; }
    if (empty) { empty.hidden = true; }
    figure.setAttribute("data-point-count", String(samples.length));
    var data = columns();
    if (chart) { chart.setData(data); return; }
    chart = new window.uPlot({
      width: width(),
      height: 240,
      scales: { x: { time: true, range: xRange }, pct: { range: [0, null] }, W: { range: [0, null] }, GiB: { range: [0, null] } },
      axes: [
        { stroke: "#5a6677", grid: { stroke: "#e8ecf1" } },
        { scale: "pct", label: "%", stroke: "#5a6677", grid: { stroke: "#e8ecf1" }, size: 50 },
        { scale: "W", label: "W", side: 1, stroke: "#5a6677", grid: { show: false }, size: 50 }
      ],
      series: [
        { label: "time" },
        { label: "GPU util %", scale: "pct", stroke: "#1f5fd6", width: 2 },
        { label: "CPU %", scale: "pct", stroke: "#7a4100", width: 1.5 },
        { label: "GPU power W", scale: "W", stroke: "#b42318", width: 1.5 },
        { label: "GPU mem GiB", scale: "GiB", stroke: "#5b2fb5", width: 1.5, value: function (u, v) { return v === null ? "—" : v.toFixed(1); } },
        { label: "host mem GiB", scale: "GiB", stroke: "#17673a", width: 1.5, value: function (u, v) { return v === null ? "—" : v.toFixed(2); } }
      ],
      hooks: { draw: [drawMarkers] }
    }, data, plot);
    figure.metricsChart = chart;
  }

  function running() { return header && ["Running", "Stopping", "Pending - failoverinprogress"].indexOf(header.getAttribute("data-status")) >= 0; }

  function poll() {
    if (document.hidden || !running()) { return; }
    fetch(figure.getAttribute("data-metrics-url"), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) { if (body) { samples = body; draw(); } })
      .catch(function () { /* the next poll tries again */ });
  }

  samples = parse("metrics-samples") || [];
  draw();
  window.setInterval(poll, POLL_MS);
  document.addEventListener("console:regions", function () { if (chart) { chart.redraw(); } poll(); });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () { if (chart) { chart.setSize({ width: width(), height: 240 }); } }, 150);
  });
})();
