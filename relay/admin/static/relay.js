// relay dashboard: the only script. Pages whose content changes on its own
// (Overview, Deliveries, Dead letter, Targets, an event's page) keep themselves
// up to date.
//
// Every 10 s the page asks for itself again (the same address, with the same
// session cookie: a plain GET) and swaps the parts marked data-live for the
// fresh ones. Nothing is reloaded, so the scroll position, text typed in a
// form and boxes ticked stay. It waits while a form field, or anything inside
// those parts, has the focus, while boxes in them are ticked or text in them
// is selected (a swap would take these away), and while the tab is hidden.
// Without this script the pages are the same, and a reload updates them.
(function () {
  "use strict";
  var EVERY = 10000;
  var KEY = "relay:auto-refresh";
  var live = document.getElementById("live");
  var box = document.getElementById("auto-refresh");
  var state = document.getElementById("live-state");
  if (!live || !box || !state || !window.fetch || !window.DOMParser) { return; }

  var timer = null;
  var busy = false;
  var stopped = false;
  var parts = function () { return document.querySelectorAll("[data-live][id]"); };
  var say = function (text) { state.textContent = text; };

  var stored = function () {
    try { return window.localStorage.getItem(KEY); } catch (e) { return null; }
  };
  var remember = function (value) {
    try { window.localStorage.setItem(KEY, value); } catch (e) { /* private mode: not kept */ }
  };

  var inside = function (node) {
    for (var i = 0, all = parts(); i < all.length; i++) {
      if (all[i].contains(node)) { return true; }
    }
    return false;
  };

  // Why the parts must stay as they are now, or "" when they may be swapped.
  var held = function () {
    var focused = document.activeElement;
    if (focused && focused !== box && focused.matches("input, select, textarea")) {
      return "paused while a field has the focus";
    }
    if (focused && focused !== document.body && inside(focused)) {
      return "paused while the focus is in the list";
    }
    for (var i = 0, all = parts(); i < all.length; i++) {
      if (all[i].querySelector("input[type=checkbox]:checked")) {
        return "paused while boxes are ticked";
      }
    }
    var selection = window.getSelection && window.getSelection();
    if (selection && !selection.isCollapsed && inside(selection.anchorNode)) {
      return "paused while text is selected";
    }
    return "";
  };

  var swap = function (fresh) {
    var x = window.scrollX, y = window.scrollY;
    var boxes = [];
    document.querySelectorAll(".scroll").forEach(function (el) {
      boxes.push([el, el.scrollLeft, el.scrollTop]);
    });
    parts().forEach(function (part) {
      var next = fresh.getElementById(part.id);
      if (!next || next.innerHTML === part.innerHTML) { return; }
      var moved = document.createDocumentFragment();
      while (next.firstChild) { moved.appendChild(document.adoptNode(next.firstChild)); }
      part.textContent = "";
      part.appendChild(moved);
    });
    boxes.forEach(function (kept) {
      if (kept[0].isConnected) { kept[0].scrollLeft = kept[1]; kept[0].scrollTop = kept[2]; }
    });
    window.scrollTo(x, y);
  };

  var arm = function () {
    if (timer) { window.clearTimeout(timer); timer = null; }
    if (box.checked && !stopped && !busy && document.visibilityState !== "hidden") {
      timer = window.setTimeout(update, EVERY);
    }
  };

  var update = function () {
    if (timer) { window.clearTimeout(timer); timer = null; }
    var reason = held();
    if (reason) { say(reason); arm(); return; }
    busy = true;
    var controller = window.AbortController ? new window.AbortController() : null;
    var limit = controller && window.setTimeout(function () { controller.abort(); }, EVERY);
    window.fetch(window.location.href, {
      credentials: "same-origin",
      cache: "no-store",
      signal: controller ? controller.signal : undefined
    }).then(function (response) {
      // Sent elsewhere (a session that ended goes to the sign-in page): stop asking.
      var path = new URL(response.url).pathname;
      if (path !== window.location.pathname) {
        stopped = true;
        throw new Error(path === "/login" ? "signed out: reload the page to sign in"
          : "not updated: reload the page");
      }
      // 400: the page with a problem in its filters, said beside the form.
      if (!response.ok && response.status !== 400) {
        throw new Error("HTTP " + response.status);
      }
      return response.text();
    }).then(function (html) {
      var reason = held(); // the person may have started while the page was asked for
      if (reason) { say(reason); return; }
      swap(new window.DOMParser().parseFromString(html, "text/html"));
      say("updated " + new Date().toTimeString().slice(0, 8));
    }).catch(function (problem) {
      if (stopped) { say(problem.message); return; }
      say("not updated: " + (problem.name === "AbortError" ? "no answer" : problem.message));
    }).then(function () {
      if (limit) { window.clearTimeout(limit); }
      busy = false;
      arm();
    });
  };

  live.hidden = false;
  box.checked = stored() !== "off";
  box.addEventListener("change", function () {
    remember(box.checked ? "on" : "off");
    if (box.checked && !busy) { update(); } else { arm(); say(""); }
  });
  // Hidden, the tab asks for nothing; shown again, it catches up at once.
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "hidden") {
      arm();
    } else if (box.checked && !busy && !stopped) {
      update();
    }
  });
  arm();
})();
