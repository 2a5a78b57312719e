// The console's only script of its own (the CSP allows no inline script): "select all"
// checkboxes, a busy label on forms that take a while (a group archive), and live
// figures that rest while the tab is hidden.
document.addEventListener("change", function (event) {
  var box = event.target;
  var name = box.getAttribute && box.getAttribute("data-select-all");
  if (!name) return;
  box.form.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (item) {
    item.checked = box.checked;
  });
});
document.addEventListener("submit", function (event) {
  var form = event.target;
  var text = form.getAttribute("data-busy-text");
  if (!text) return;
  var button = event.submitter;
  if (button) {
    // Keep the submitter's name/value in the request: disable only after it is sent.
    setTimeout(function () { button.disabled = true; button.textContent = text; }, 0);
  }
  form.setAttribute("aria-busy", "true");
});
// Live figures and progress (elements marked data-live, polled by htmx; docs/decisions.md "Live figures poll, and rest while the tab is hidden"):
// no request while the tab is hidden (the poll comes round and is held
// back, counted on <html data-polls-held-back>), and one at once when it is shown again.
document.addEventListener("htmx:beforeRequest", function (event) {
  var source = event.detail && event.detail.elt;
  if (document.visibilityState !== "hidden" || !source || !source.hasAttribute("data-live")) return;
  event.preventDefault();
  var root = document.documentElement;
  var held = Number(root.getAttribute("data-polls-held-back") || 0) + 1;
  root.setAttribute("data-polls-held-back", String(held));
});
document.addEventListener("visibilitychange", function () {
  if (document.visibilityState === "hidden" || !window.htmx) return;
  document.querySelectorAll("[data-live]").forEach(function (element) {
    window.htmx.trigger(element, "live-refresh");
  });
});
