/* Compare: one metric of several jobs by step, one line each, drawn with the vendored uPlot.
 *
 * The page embeds each job's [step, value] pairs (json_script "compare-series"); uPlot wants one
 * x array, so the steps of all jobs are merged and a job's value is null where it logged none
 * there (the line spans the gap).
 */
(function () {
  "use strict";

  var figure = document.querySelector("[data-compare-chart]");
  var data = document.getElementById("compare-series");
  if (!figure || !data || typeof window.uPlot !== "function") { return; }
  var plot = figure.querySelector("[data-compare-plot]");
  var empty = figure.querySelector("[data-compare-empty]");
  var COLOURS = ["#1f5fd6", "#c2410c", "#15803d", "#7c3aed", "#b42318", "#0e7490", "#a16207", "#4b5563"];

  var series = [];
  try { series = JSON.parse(data.textContent) || []; } catch (error) { series = []; }
  var drawn = series.filter(function (s) { return s.points && s.points.length; });
  figure.setAttribute("data-series-count", String(drawn.length));
  if (!drawn.length) { if (empty) { empty.hidden = false; } return; }

  var steps = [];
  var seen = {};
  drawn.forEach(function (s) { s.points.forEach(function (p) { if (!seen[p[0]]) { seen[p[0]] = true; steps.push(p[0]); } }); });
  steps.sort(function (a, b) { return a - b; });
  var columns = [steps];
  drawn.forEach(function (s) {
    var byStep = {};
    s.points.forEach(function (p) { byStep[p[0]] = p[1]; });
    columns.push(steps.map(function (step) { return Object.prototype.hasOwnProperty.call(byStep, step) ? byStep[step] : null; }));
  });

  function width() { return Math.max(240, plot.clientWidth || figure.clientWidth || 600); }
  var metric = figure.getAttribute("data-metric") || "value";
  var chart = new window.uPlot({
    width: width(),
    height: 300,
    cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false } },
    axes: [
      { label: "step", stroke: "#5a6677", grid: { stroke: "#e8ecf1" } },
      { label: metric, stroke: "#5a6677", grid: { stroke: "#e8ecf1" }, size: 60 }
    ],
    series: [{ label: "step" }].concat(drawn.map(function (s, i) {
      return { label: s.name + " #" + s.id, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: true, points: { show: s.points.length < 60 } };
    }))
  }, columns, plot);

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () { chart.setSize({ width: width(), height: 300 }); }, 150);
  });
})();
