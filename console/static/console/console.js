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

  // On a phone a job tab's tables (and the Queue page's) stack each row into a small card (console.css .table-stack),
  // each cell labelled with its column's header, rows that arrive live included.
  var label = function (root) {
    root.querySelectorAll("table.table").forEach(function (table) {
      var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) { return th.textContent.trim(); });
      if (!heads.length) { return; }
      table.classList.add("table-stack");
      table.querySelectorAll("tbody tr").forEach(function (row) {
        Array.prototype.forEach.call(row.children, function (cell, i) {
          if (heads[i] && !cell.hasAttribute("data-label") && !cell.hasAttribute("colspan")) { cell.setAttribute("data-label", heads[i]); }
        });
      });
    });
  };
  document.querySelectorAll(".tab-panel, [data-stack-tables]").forEach(function (panel) {
    label(panel);
    // Only attributes change in the callback, so it does not wake itself.
    new MutationObserver(function () { label(panel); }).observe(panel, { childList: true, subtree: true });
  });

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
    // Compare: the selected jobs' curves on one chart (a page of its own, by GET).
    bulkForm.addEventListener("click", function (event) {
      var button = event.target.closest("[data-compare]");
      if (!button) { return; }
      var ids = boxes().filter(function (box) { return box.checked; }).map(function (box) { return box.value; });
      if (ids.length) { window.location.assign(button.getAttribute("data-compare") + "?jobs=" + ids.join(",")); }
    });
    bulkForm.addEventListener("change", function (event) {
      var selectAll = selectAllBox();
      if (selectAll && event.target === selectAll) {
        boxes().forEach(function (box) { box.checked = selectAll.checked; });
      }
      refresh();
    });
    refresh();
  }

  // A bulk action names what it acts on: an in-page dialog lists the selected jobs before it runs.
  var dialog = document.querySelector("[data-confirm-dialog]");
  if (bulkForm && dialog && typeof dialog.showModal === "function") {
    var pending = null;
    bulkForm.addEventListener("click", function (event) {
      var button = event.target.closest("[data-confirm-selected]");
      if (!button) { return; }
      event.preventDefault();
      var names = Array.prototype.slice.call(bulkForm.querySelectorAll('input[name="job_ids"]:checked')).map(function (box) {
        var link = box.closest("tr").querySelector('[data-field="name"] a');
        return link ? link.textContent : box.value;
      });
      var verb = button.getAttribute("data-confirm-selected");
      dialog.querySelector("[data-confirm-title]").textContent = verb + " " + names.length + " job" + (names.length === 1 ? "" : "s") + "?";
      var list = dialog.querySelector("[data-confirm-names]");
      list.textContent = "";
      names.forEach(function (name) { var li = document.createElement("li"); li.textContent = name; list.appendChild(li); });
      dialog.querySelector("[data-confirm-yes]").textContent = verb;
      pending = button;
      dialog.showModal();
    });
    dialog.querySelector("[data-confirm-yes]").addEventListener("click", function () {
      dialog.close();
      if (pending) { bulkForm.requestSubmit(pending); pending = null; }
    });
    dialog.querySelector("[data-confirm-no]").addEventListener("click", function () { pending = null; dialog.close(); });
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
