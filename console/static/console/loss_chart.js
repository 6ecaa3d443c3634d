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

  var points = [];
  try { points = JSON.parse(data.textContent) || []; } catch (error) { points = []; }
  var steps = [];
  var losses = [];
  points.forEach(function (p) {
    if (p.loss !== null && p.loss !== undefined) { steps.push(p.step); losses.push(p.loss); }
  });

  var chart = null;

  function width() { return Math.max(240, plot.clientWidth || figure.clientWidth || 600); }

  function draw() {
    if (!steps.length) { return; }
    if (empty) { empty.hidden = true; }
    if (chart) { chart.setData([steps, losses]); return; }
    chart = new window.uPlot({
      width: width(),
      height: 240,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false } },
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

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () { if (chart) { chart.setSize({ width: width(), height: 240 }); } }, 150);
  });

  draw();
})();
