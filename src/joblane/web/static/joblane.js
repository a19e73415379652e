// joblane dashboard: the only script, and optional: every page works without it.
// A "select all" box ticks the boxes of its table (or of its data-scope).
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.classList || !box.classList.contains("select-all")) return;
  var scope = box.getAttribute("data-scope");
  var boxes = scope
    ? document.querySelectorAll('input[type=checkbox][name=ids][data-scope="' + scope + '"]')
    : (box.closest("table") || document).querySelectorAll("input[type=checkbox][name=ids]");
  boxes.forEach(function (b) { b.checked = box.checked; });
});
