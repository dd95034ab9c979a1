// zeroth-pg web: a URL opened with ?token=… has set the token's cookie; the token leaves the
// address bar (and so history and bookmarks) at once.
(function () {
  if (!window.URLSearchParams || !window.history || !history.replaceState) return;
  var params = new URLSearchParams(location.search);
  if (!params.has("token")) return;
  params.delete("token");
  var rest = params.toString();
  history.replaceState(history.state, "", location.pathname + (rest ? "?" + rest : "") +
                       location.hash);
})();

// zeroth-pg web: live updates. Every page's live parts refresh in place, never by a reload:
// the overview's body from /overview.json every 2 s; on any other page each element marked
// data-live (or, on a page that marks none, its <main>) from a GET of the page's own URL every
// body[data-live-ms] ms. A part is left alone while it holds the focus or a form control the
// operator has changed; open <details> stay open. Nothing is fetched while the tab is hidden
// or the operator has paused it (the header's live button; remembered for the tab). A page
// holding an element marked data-static (a confirmation, an action's result) never refreshes.
(function () {
  var body = document.body;
  var toggle = document.getElementById("live-toggle");
  var every = parseInt(body.dataset.liveMs || "5000", 10);
  var KEY = "zeroth-pg-live-paused";
  var paused = false;
  try { paused = sessionStorage.getItem(KEY) === "1"; } catch (e) {}
  var busy = false;

  var still = !!document.querySelector("[data-static]");
  function show() {
    body.dataset.liveState = still ? "static" : paused ? "paused" : "on";
    if (toggle && still) {
      toggle.textContent = "not live";
      toggle.disabled = true;
      toggle.className = "live paused";
      toggle.title = "this page is a confirmation or a result: it does not refresh";
    } else if (toggle) {
      toggle.textContent = paused ? "paused" : "live";
      toggle.className = paused ? "live paused" : "live";
      toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    }
  }
  if (toggle) {
    toggle.addEventListener("click", function () {
      paused = !paused;
      try { sessionStorage.setItem(KEY, paused ? "1" : "0"); } catch (e) {}
      show();
    });
  }
  show();

  function regions(doc) {
    if (doc.querySelector("[data-static]")) return [];  // a confirmation: its ids stay as shown
    var found = doc.querySelectorAll("[data-live]");
    if (found.length) return Array.prototype.slice.call(found);
    var main = doc.querySelector("main");
    return main ? [main] : [];
  }

  function touched(el) {
    if (el.contains(document.activeElement) && document.activeElement !== document.body) {
      return true;
    }
    var fields = el.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden") continue;
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].selected !== f.options[j].defaultSelected) return true;
        }
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function swap(old, fresh) {
    var open = [];
    var was = old.querySelectorAll("details");
    for (var i = 0; i < was.length; i++) open.push(was[i].open);
    old.innerHTML = fresh.innerHTML;
    var now = old.querySelectorAll("details");
    for (var k = 0; k < now.length && k < open.length; k++) now[k].open = open[k];
  }

  function refreshPage() {
    return fetch(location.href, {credentials: "same-origin", cache: "no-store",
                                 headers: {"X-Zeroth-Live": "1"}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null || paused) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var mine = regions(document), theirs = regions(doc);
        for (var i = 0; i < mine.length; i++) {
          var match = mine[i].id ? doc.getElementById(mine[i].id) : theirs[i];
          if (match && !touched(mine[i])) swap(mine[i], match);
        }
        body.dataset.refreshed = String(parseInt(body.dataset.refreshed || "0", 10) + 1);
      });
  }

  function refreshOverview(box) {
    return fetch(box.dataset.refresh, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d || paused) return;
        box.innerHTML = d.html;
        body.dataset.refreshed = String(parseInt(body.dataset.refreshed || "0", 10) + 1);
      });
  }

  var overview = document.getElementById("overview");
  if (!overview && !document.querySelector("main")) return;
  setInterval(function () {
    if (paused || busy || document.hidden) return;
    busy = true;
    (overview ? refreshOverview(overview) : refreshPage())
      .catch(function () {})
      .then(function () { busy = false; });
  }, overview ? 2000 : every);
})();
