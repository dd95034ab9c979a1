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

// zeroth-pg web: the overview refreshes its body every 2 s (plain fetch, no full reload).
(function () {
  var box = document.getElementById("overview");
  if (!box) return;
  setInterval(function () {
    fetch(box.dataset.refresh, {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) { if (d) box.innerHTML = d.html; })
      .catch(function () {});
  }, 2000);
})();
