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
