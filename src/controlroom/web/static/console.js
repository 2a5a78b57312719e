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
// An action's outcome banner (the flash of its redirect; docs/decisions.md "Console
// actions answer with a redirect") describes the page as it was: it goes once a live
// part of the page (not the page-wide figures, data-live="figures") shows a change, and
// a notice also after FLASH_SECONDS. An error stays until the page is left.
var FLASH_SECONDS = 20;
var liveBefore = new WeakMap(); // a live element being swapped -> its text before
function liveText(element) { return element.textContent.replace(/\s+/g, " ").trim(); }
function dismissFlashes(selector) {
  document.querySelectorAll(selector).forEach(function (flash) { flash.remove(); });
}
document.addEventListener("htmx:beforeSwap", function (event) {
  var target = event.detail && event.detail.target;
  if (target && target.hasAttribute("data-live") && target.getAttribute("data-live") !== "figures") {
    liveBefore.set(target, liveText(target));
  }
});
document.addEventListener("htmx:afterSwap", function (event) {
  var target = event.detail && event.detail.target;
  if (!target || !liveBefore.has(target)) return;
  var before = liveBefore.get(target);
  liveBefore.delete(target);
  // An outerHTML swap leaves the old element detached: the new one has its id.
  var now = target.isConnected ? target : target.id && document.getElementById(target.id);
  if (!now || liveText(now) !== before) dismissFlashes("[data-testid=flash]");
});
document.addEventListener("DOMContentLoaded", function () {
  if (!document.querySelector(".flash.notice")) return;
  setTimeout(function () { dismissFlashes(".flash.notice"); }, FLASH_SECONDS * 1000);
});
