// The console's only script of its own (the CSP allows no inline script): "select all"
// checkboxes, and a busy label on forms that take a while (a group archive).
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
