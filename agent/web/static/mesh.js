// mesh's page script: follows the agent's events (the replica changed)
// and swaps the page's main part for a fresh one, so the page updates
// itself without a reload. Everything works without it, with a reload.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var live = document.getElementById("live");
  if (!main || !main.dataset.live || !window.EventSource) { return; }
  var pending = false, busy = false, es = null, retry = null;
  function say(text, ok) {
    if (live) { live.textContent = text; live.className = ok ? "live" : "live off"; }
  }
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
        // What the operator opened stays open.
        var open = {};
        main.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
        main.innerHTML = html;
        main.querySelectorAll("details[id]").forEach(function (d) { if (d.id in open) { d.open = open[d.id]; } });
        main.dataset.updated = String(Date.now());
        document.dispatchEvent(new Event("mesh:updated"));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (pending) { pending = false; setTimeout(refresh, 100); }
      });
  }
  function open() {
    if (es) { return; }
    es = new EventSource("/events");
    es.addEventListener("changed", function (e) {
      // The first event says where the replica is now: the page refreshes
      // only if that is past what it was rendered at.
      if (e.data === main.dataset.index) { return; }
      main.dataset.index = e.data;
      refresh();
    });
    es.onopen = function () { say("live", true); };
    es.onerror = function () {
      if (es.readyState !== EventSource.CLOSED) { say("reconnecting", false); return; }
      // The agent refused the stream: a session that ended goes to the
      // login page; anything else is tried again in a while.
      es = null;
      fetch(location.pathname + location.search, { headers: { "X-Mesh-Part": "main" }, credentials: "same-origin" })
        .then(function (r) {
          if (r.status === 401) { location.reload(); return; }
          say("not live: retrying", false);
          clearTimeout(retry);
          retry = setTimeout(open, 15000);
        })
        .catch(function () { say("not live: retrying", false); clearTimeout(retry); retry = setTimeout(open, 15000); });
    };
  }
  function close() {
    clearTimeout(retry);
    if (es) { es.close(); es = null; }
    say("paused", false);
  }
  // A tab nobody looks at holds no stream (an agent serves a few dozen).
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { close(); } else { open(); }
  });
  document.addEventListener("focusout", function () { if (pending) { setTimeout(refresh, 0); } });
  if (!document.hidden) { open(); } else { say("paused", false); }
})();
