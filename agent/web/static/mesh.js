// mesh's page script: follows the agent's events (the replica changed)
// and swaps the page's main part for a fresh one, so the page updates
// itself without a reload. Everything works without it, with a reload.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var live = document.getElementById("live");
  if (!main || !main.dataset.live || !window.EventSource) { return; }
  var pending = false, busy = false;
  function refresh() {
    if (busy) { pending = true; return; }
    // A form the operator is filling in stays as it is.
    var a = document.activeElement;
    if (a && a.form && main.contains(a)) { pending = true; return; }
    busy = true;
    fetch(location.pathname + location.search, { headers: { "X-Mesh-Part": "main" }, credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 401) { location.reload(); throw new Error("session ended"); }
        if (!r.ok) { throw new Error(r.status); }
        return r.text();
      })
      .then(function (html) {
        main.innerHTML = html;
        main.dataset.updated = String(Date.now());
        document.dispatchEvent(new Event("mesh:updated"));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (pending) { pending = false; setTimeout(refresh, 100); }
      });
  }
  var es = new EventSource("/events");
  es.addEventListener("changed", function (e) {
    main.dataset.index = e.data;
    refresh();
  });
  es.onopen = function () { if (live) { live.textContent = "live"; live.className = "live"; } };
  es.onerror = function () { if (live) { live.textContent = "reconnecting"; live.className = "live off"; } };
  document.addEventListener("focusout", function () { if (pending) { setTimeout(refresh, 0); } });
})();
