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

// A block with data-refresh="N" and data-src="/live/..." is live: every N seconds
// its HTML is fetched from data-src (a fragment the server renders) and swapped
// in, while the tab is visible. Without this script the page reloads itself
// (a <noscript> meta refresh), so nothing depends on it.
(function () {
  var live = document.querySelector("[data-refresh][data-src]");
  if (!live) return;
  var seconds = parseInt(live.getAttribute("data-refresh"), 10);
  if (!(seconds > 0)) return;
  var src = live.getAttribute("data-src");
  var stamp = document.getElementById("updated");
  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(src, { credentials: "same-origin", cache: "no-store", redirect: "manual" })
      .then(function (response) {
        if (response.type === "opaqueredirect" || response.status === 401) {
          window.location.reload();  // signed out meanwhile: the full page asks to sign in
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (html === null) return;
        live.innerHTML = html;
        live.removeAttribute("data-stale");
        live.setAttribute("data-updated", String(Date.now()));
        if (stamp) stamp.textContent = "(updated " + new Date().toLocaleTimeString() + ")";
      })
      .catch(function () {
        live.setAttribute("data-stale", "1");
        if (stamp) stamp.textContent = "(cannot reach the dashboard: retrying)";
      })
      .then(function () { busy = false; });
  }
  setInterval(refresh, seconds * 1000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
})();
