// Live refresh: a page that carries data-live (a fingerprint of what it shows) polls /live
// every second; when the fingerprint changes, it fetches itself and swaps its <main>.
(function () {
  "use strict";
  var body = document.body;
  if (!body || !body.hasAttribute("data-live")) return;
  var current = body.getAttribute("data-live");
  var busy = false;
  function refresh() {
    // Marked as the page's own request: it does not keep the session from idling out.
    return fetch(location.href, { credentials: "same-origin", headers: { "X-Pgsched-Refresh": "1" } }).then(function (r) {
      if (!r.ok) return;
      return r.text().then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var main = doc.getElementById("main");
        if (main) document.getElementById("main").innerHTML = main.innerHTML;
        current = doc.body.getAttribute("data-live") || current;
        body.setAttribute("data-live", current);
      });
    });
  }
  function tick() {
    if (busy || document.hidden) return;
    busy = true;
    fetch("/live", { credentials: "same-origin" }).then(function (r) {
      if (r.status === 401) { location.href = "/signin?next=" + encodeURIComponent(location.pathname); return; }
      return r.json().then(function (d) {
        if (d.v && d.v !== current) { current = d.v; return refresh(); }
      });
    }).catch(function () {
      var s = document.getElementById("live-state"); if (s) s.textContent = "offline";
    }).finally(function () { busy = false; });
  }
  setInterval(tick, 1000);
})();
