/* The loss curve on a job's Details tab, drawn with the vendored uPlot (console/static/vendor/uplot).
 *
 * The page embeds the points (json_script "loss-points"); live.js raises "console:progress" as the
 * log tells a new loss, and the curve grows without a reload.
 */
(function () {
  "use strict";

  var figure = document.querySelector("[data-loss-chart]");
  var data = document.getElementById("loss-points");
  if (!figure || !data || typeof window.uPlot !== "function") { return; }
  var plot = figure.querySelector("[data-loss-plot]");
  var empty = figure.querySelector("[data-loss-empty]");
  var MAX_POINTS = 2000;

  var steps = [];
  var losses = [];

  // The points the server stored (every step the log told; live messages are thinned to ~1/s).
  function readPoints() {
    var script = document.getElementById("loss-points");
    var points = [];
    try { points = JSON.parse(script.textContent) || []; } catch (error) { points = []; }
    var fresh = { steps: [], losses: [] };
    points.forEach(function (p) {
      if (p.loss !== null && p.loss !== undefined) { fresh.steps.push(p.step); fresh.losses.push(p.loss); }
    });
    return fresh;
  }

  function load() {
    var fresh = readPoints();
    // Keep live points newer than the stored ones (a message may beat the re-read).
    var lastStored = fresh.steps.length ? fresh.steps[fresh.steps.length - 1] : -Infinity;
    for (var i = 0; i < steps.length; i += 1) {
      if (steps[i] > lastStored) { fresh.steps.push(steps[i]); fresh.losses.push(losses[i]); }
    }
    steps = fresh.steps;
    losses = fresh.losses;
  }
  load();

  var chart = null;
  var logToggle = figure.querySelector("[data-loss-log]");

  // Vertical lines at the steps where a new attempt resumed (red) and checkpoints were committed (green).
  function drawMarkers(u) {
    var el = document.getElementById("chart-markers");
    var m = null;
    try { m = el ? JSON.parse(el.textContent) : null; } catch (error) { m = null; }
    if (!m) { return; }
    var ctx = u.ctx;
    function line(step, colour, dash) {
      var x = Math.round(u.valToPos(step, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) { return; }
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
      ctx.setLineDash(dash);
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.restore();
    }
    (m.checkpoints || []).forEach(function (c) { line(c.step, "rgba(23, 103, 58, .45)", [2, 3]); });
    (m.attempts || []).forEach(function (a) { if (a.number > 1 && a.resume_step !== null && a.resume_step !== undefined) { line(a.resume_step, "#b42318", [6, 4]); } });
  }

  function width() { return Math.max(240, plot.clientWidth || figure.clientWidth || 600); }

  function draw() {
    if (!steps.length) { return; }
    if (empty) { empty.hidden = true; }
    // What the chart holds, for assistive technology and for tests that read the page.
    figure.setAttribute("data-point-count", String(steps.length));
    figure.setAttribute("data-last-step", String(steps[steps.length - 1]));
    plot.setAttribute("aria-label", "Training loss by step: " + steps.length + " points, latest loss " + losses[losses.length - 1]);
    if (chart) { chart.setData([steps, losses]); return; }
    var logScale = Boolean(logToggle && logToggle.checked);
    figure.setAttribute("data-scale", logScale ? "log" : "linear");
    chart = new window.uPlot({
      width: width(),
      height: 240,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, y: logScale ? { distr: 3 } : {} },
      hooks: { draw: [drawMarkers] },
      axes: [
        { label: "step", stroke: "#5a6677", grid: { stroke: "#e8ecf1" } },
        { label: "loss", stroke: "#5a6677", grid: { stroke: "#e8ecf1" }, size: 60 }
      ],
      series: [
        { label: "step" },
        { label: "loss", stroke: "#1f5fd6", width: 2, points: { show: steps.length < 60 } }
      ]
    }, [steps, losses], plot);
  }

  // The newest point of each step wins; points stay in step order.
  function add(step, loss) {
    var last = steps.length - 1;
    if (last >= 0 && step === steps[last]) { losses[last] = loss; }
    else if (last < 0 || step > steps[last]) { steps.push(step); losses.push(loss); }
    else { return; }
    if (steps.length > MAX_POINTS) {
      // Thin the older half: every other point goes, the curve keeps its shape.
      var keepSteps = [];
      var keepLosses = [];
      for (var i = 0; i < steps.length; i += 1) {
        if (i % 2 === 0 || i === steps.length - 1) { keepSteps.push(steps[i]); keepLosses.push(losses[i]); }
      }
      steps = keepSteps;
      losses = keepLosses;
    }
    draw();
  }

  document.addEventListener("console:progress", function (event) {
    var p = event.detail && event.detail.progress;
    if (p && p.step !== null && p.step !== undefined && p.loss !== null && p.loss !== undefined) { add(p.step, p.loss); }
  });

  document.addEventListener("console:regions", function () { load(); draw(); if (chart) { chart.redraw(); } });
  if (logToggle) {
    logToggle.addEventListener("change", function () {
      if (chart) { chart.destroy(); chart = null; }
      draw();
    });
  }

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () { if (chart) { chart.setSize({ width: width(), height: 240 }); } }, 150);
  });

  draw();
})();
