/* The training curves on a job's Details tab, drawn with the vendored uPlot (console/static/vendor/uplot).
 *
 * The page embeds the points (json_script "loss-points"); each has the loss and the other numbers
 * the Trainer logged at its step ("values": eval_loss, grad_norm …), and the Metric select picks
 * the curve. live.js raises "console:progress" as the log tells a new loss, and the loss curve
 * grows without a reload (the others with the next re-read of the points).
 */
(function () {
  "use strict";

  var figure = document.querySelector("[data-loss-chart]");
  var data = document.getElementById("loss-points");
  if (!figure || !data || typeof window.uPlot !== "function") { return; }
  var plot = figure.querySelector("[data-loss-plot]");
  var empty = figure.querySelector("[data-loss-empty]");
  var MAX_POINTS = 2000;
  var metricSelect = figure.querySelector("[data-loss-metric]");
  var metric = metricSelect ? metricSelect.value : "loss";

  function valueOf(p) {
    if (metric === "loss") { return p.loss; }
    return p.values ? p.values[metric] : undefined;
  }

  var steps = [];
  var losses = [];
  var epochs = [];  // the Trainer's epoch at each point, or null where the log told none

  // The points the server stored (every step the log told; live messages are thinned to ~1/s).
  function readPoints() {
    var script = document.getElementById("loss-points");
    var points = [];
    try { points = JSON.parse(script.textContent) || []; } catch (error) { points = []; }
    var fresh = { steps: [], losses: [], epochs: [] };
    points.forEach(function (p) {
      var value = valueOf(p);
      if (value !== null && value !== undefined) {
        fresh.steps.push(p.step); fresh.losses.push(value); fresh.epochs.push(known(p.epoch) ? p.epoch : null);
      }
    });
    return fresh;
  }

  function known(value) { return value !== null && value !== undefined && isFinite(value); }

  function load() {
    var fresh = readPoints();
    // Keep live points newer than the stored ones (a message may beat the re-read).
    var lastStored = fresh.steps.length ? fresh.steps[fresh.steps.length - 1] : -Infinity;
    for (var i = 0; i < steps.length && metric === "loss"; i += 1) {
      if (steps[i] > lastStored) { fresh.steps.push(steps[i]); fresh.losses.push(losses[i]); fresh.epochs.push(epochs[i]); }
    }
    steps = fresh.steps;
    losses = fresh.losses;
    epochs = fresh.epochs;
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
    var drawn = { checkpoint: 0, resume: 0 };
    function line(step, colour, dash, kind) {
      var x = Math.round(u.valToPos(step, "x", true));
      // A step at either end of the axis sits on the plot's edge: rounding may put it a pixel out.
      if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) { return; }
      drawn[kind] += 1;
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
      ctx.setLineDash(dash);
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.restore();
    }
    (m.checkpoints || []).forEach(function (c) { line(c.step, "rgba(23, 103, 58, .45)", [2, 3], "checkpoint"); });
    (m.attempts || []).forEach(function (a) { if (a.number > 1 && a.resume_step !== null && a.resume_step !== undefined) { line(a.resume_step, "#b42318", [6, 4], "resume"); } });
    // What the chart marks, for tests and assistive technology (the legend below says it in words).
    figure.setAttribute("data-checkpoint-markers", String(drawn.checkpoint));
    figure.setAttribute("data-resume-markers", String(drawn.resume));
    legend(m);
  }

  // The epoch at a step, interpolated between the points that told one (the Trainer logs its epoch
  // with each loss); null outside them or where none was told.
  function epochAt(step) {
    var before = -1;
    var after = -1;
    for (var i = 0; i < steps.length; i += 1) {
      if (epochs[i] === null) { continue; }
      if (steps[i] <= step) { before = i; }
      if (steps[i] >= step) { after = i; break; }
    }
    if (before < 0 || after < 0) { return null; }
    if (steps[after] === steps[before]) { return epochs[before]; }
    var share = (step - steps[before]) / (steps[after] - steps[before]);
    return epochs[before] + share * (epochs[after] - epochs[before]);
  }

  function hasEpochs() { return epochs.some(function (e) { return e !== null; }); }

  function epochLabels(u, splits) {
    var labels = splits.map(function (step) {
      var e = epochAt(step);
      return e === null ? "" : String(Math.round(e * 100) / 100);
    });
    // uPlot draws the ticks on its canvas: the page says them too, for tests that read it.
    figure.setAttribute("data-epoch-ticks", labels.filter(Boolean).join(" "));
    return labels;
  }

  // The markers in words, under the chart: which attempt resumed from which step, how many checkpoints.
  function legend(m) {
    var resumed = (m.attempts || []).filter(function (a) { return a.number > 1 && known(a.resume_step); });
    var saved = (m.checkpoints || []).length;
    var parts = resumed.map(function (a) { return "attempt " + a.number + " resumed from step " + a.resume_step; });
    var text = (parts.length ? "Red dashed: " + parts.join(", ") + ". " : "") +
      (saved ? "Green dotted: " + saved + (saved === 1 ? " committed checkpoint." : " committed checkpoints.") : "");
    var el = figure.querySelector("[data-loss-legend]");
    if (!text) { if (el) { el.remove(); } return; }
    if (!el) {
      el = document.createElement("p");
      el.className = "muted small chart__legend";
      el.setAttribute("data-loss-legend", "");
      plot.insertAdjacentElement("afterend", el);
    }
    if (el.textContent !== text) { el.textContent = text; }
  }

  function width() { return Math.max(240, plot.clientWidth || figure.clientWidth || 600); }

  function draw() {
    figure.setAttribute("data-metric", metric);
    if (!steps.length) { if (empty) { empty.hidden = false; } return; }
    if (empty) { empty.hidden = true; }
    // What the chart holds, for assistive technology and for tests that read the page.
    figure.setAttribute("data-point-count", String(steps.length));
    figure.setAttribute("data-last-step", String(steps[steps.length - 1]));
    plot.setAttribute("aria-label", "Training " + metric + " by step: " + steps.length + " points, latest " + metric + " " + losses[losses.length - 1]);
    var lastEpoch = epochAt(steps[steps.length - 1]);
    if (lastEpoch !== null) { figure.setAttribute("data-last-epoch", String(lastEpoch)); }
    var withEpochs = hasEpochs();
    if (chart && withEpochs === (figure.getAttribute("data-epoch-axis") === "shown")) { chart.setData([steps, losses]); return; }
    if (chart) { chart.destroy(); chart = null; }  // the epoch axis appears with the first epoch told
    figure.setAttribute("data-epoch-axis", withEpochs ? "shown" : "none");
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
        { label: metric, stroke: "#5a6677", grid: { stroke: "#e8ecf1" }, size: 60 }
      ].concat(withEpochs ? [{ scale: "x", side: 0, label: "epoch", stroke: "#5a6677", grid: { show: false }, values: epochLabels }] : []),
      series: [
        { label: "step" },
        { label: metric, stroke: "#1f5fd6", width: 2, points: { show: steps.length < 60 } }
      ]
    }, [steps, losses], plot);
  }

  // The newest point of each step wins; points stay in step order.
  function add(step, loss, epoch) {
    var last = steps.length - 1;
    epoch = known(epoch) ? epoch : null;
    if (last >= 0 && step === steps[last]) { losses[last] = loss; if (epoch !== null) { epochs[last] = epoch; } }
    else if (last < 0 || step > steps[last]) { steps.push(step); losses.push(loss); epochs.push(epoch); }
    else { return; }
    if (steps.length > MAX_POINTS) {
      // Thin the older half: every other point goes, the curve keeps its shape.
      var keepSteps = [];
      var keepLosses = [];
      var keepEpochs = [];
      for (var i = 0; i < steps.length; i += 1) {
        if (i % 2 === 0 || i === steps.length - 1) { keepSteps.push(steps[i]); keepLosses.push(losses[i]); keepEpochs.push(epochs[i]); }
      }
      steps = keepSteps;
      losses = keepLosses;
      epochs = keepEpochs;
    }
    draw();
  }

  document.addEventListener("console:progress", function (event) {
    var p = event.detail && event.detail.progress;
    if (metric === "loss" && p && p.step !== null && p.step !== undefined && p.loss !== null && p.loss !== undefined) { add(p.step, p.loss, p.epoch); }
  });

  document.addEventListener("console:regions", function () { load(); draw(); if (chart) { chart.redraw(); } });
  // The select is re-read with the points (a first evaluation adds its metrics): listened to on
  // the figure, and kept on the metric shown.
  figure.addEventListener("change", function (event) {
    if (!event.target.matches("[data-loss-metric]")) { return; }
    metric = event.target.value;
    steps = []; losses = []; epochs = [];
    load();
    if (chart) { chart.destroy(); chart = null; }
    draw();
  });
  document.addEventListener("console:regions", function () {
    var select = figure.querySelector("[data-loss-metric]");
    if (select && select.querySelector('option[value="' + metric + '"]')) { select.value = metric; }
  });
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
