/* Small progressive enhancements for the console pages; every page works without this file. */
(function () {
  "use strict";

  // On a narrow screen the header folds into a Menu button (CSS shows it only with JavaScript on).
  document.documentElement.classList.add("js");
  var menuButton = document.querySelector("[data-menu-toggle]");
  if (menuButton) {
    menuButton.addEventListener("click", function () {
      var open = menuButton.getAttribute("aria-expanded") !== "true";
      menuButton.setAttribute("aria-expanded", open ? "true" : "false");
      menuButton.closest(".topbar").classList.toggle("is-open", open);
    });
  }

  // Ask before a destructive or disruptive submit (the server still checks everything).
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  // The job list: "select all", a selection count, and bulk buttons enabled only with a selection.
  var bulkForm = document.getElementById("bulk-form");
  if (bulkForm) {
    // The list's rows are re-rendered live (live_list.js): look the boxes up each time.
    var selectAllBox = function () { return bulkForm.querySelector("[data-select-all]"); };
    var boxes = function () { return Array.prototype.slice.call(bulkForm.querySelectorAll('input[name="job_ids"]')); };
    var count = bulkForm.querySelector("[data-selection-count]");
    var buttons = bulkForm.querySelectorAll("[data-needs-selection]");
    var refresh = function () {
      var all = boxes();
      var selectAll = selectAllBox();
      var checked = all.filter(function (box) { return box.checked; }).length;
      if (count) { count.textContent = checked ? checked + " selected" : ""; }
      buttons.forEach(function (button) { button.disabled = checked === 0; });
      if (selectAll) {
        selectAll.checked = all.length > 0 && checked === all.length;
        selectAll.indeterminate = checked > 0 && checked < all.length;
      }
    };
    bulkForm.addEventListener("change", function (event) {
      var selectAll = selectAllBox();
      if (selectAll && event.target === selectAll) {
        boxes().forEach(function (box) { box.checked = selectAll.checked; });
      }
      refresh();
    });
    refresh();
  }

  // A select that applies itself (the log's stream selector); its form keeps a submit button.
  document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });

  // Show the newest log lines first in view.
  var log = document.getElementById("log");
  if (log && log.scrollHeight > log.clientHeight) {
    log.scrollTop = log.scrollHeight;
  }

  // Move focus to the error summary of a form that came back with errors.
  var summary = document.querySelector("[data-autofocus]");
  if (summary) { summary.focus(); }
})();
