// The console's one script: keeps the lag page live without reloading it.
// Every data-live-ms, fetch the page again (same origin, the operator's login) and swap the
// contents of #live in place. Which <details> the operator unfolded is carried over to the fresh
// copy, and the rest of the page (scroll position, the header) is left alone. Served by the ops
// worker at /console/live.js: the lag page's CSP allows same-origin scripts and nothing inline.
"use strict";

(() => {
  const live = document.getElementById("live");
  if (!live) {
    return;
  }
  const every = Math.max(1000, Number(live.dataset.liveMs) || 5000);
  const note = document.getElementById("live-status");
  const steady = note ? note.textContent : "";

  function keepUnfolded(current, fresh) {
    for (const details of current.querySelectorAll("details[id]")) {
      const twin = fresh.querySelector(`details[id="${CSS.escape(details.id)}"]`);
      if (twin) {
        twin.open = details.open;
      }
    }
  }

  async function refresh() {
    try {
      const response = await fetch(window.location.pathname, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/html" },
      });
      if (!response.ok) {
        throw new Error(`the console answered ${response.status}`);
      }
      const html = await response.text();
      const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
      if (!fresh) {
        throw new Error("the answer has no live part");
      }
      const current = document.getElementById("live");
      keepUnfolded(current, fresh);
      current.replaceChildren(...fresh.childNodes);
      current.dataset.updates = String(Number(current.dataset.updates || "0") + 1);
      if (note) {
        note.textContent = steady;
        note.classList.remove("error");
      }
    } catch (error) {
      if (note) {
        note.textContent = `Live updates paused (${error.message}); retrying every ${every / 1000} s.`;
        note.classList.add("error");
      }
    } finally {
      window.setTimeout(refresh, every);
    }
  }

  window.setTimeout(refresh, every);
})();
