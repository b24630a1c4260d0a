// Night mode: the page follows the system's prefers-color-scheme until the learner picks a theme
// with the toggle in the top bar; the pick is remembered (localStorage) and set as data-theme on
// <html>. Loaded in <head> without defer, so a remembered theme applies before the first paint.
(function () {
  "use strict";
  const KEY = "studyapp-theme";
  const root = document.documentElement;
  const system = window.matchMedia("(prefers-color-scheme: dark)");

  function stored() {
    try { return localStorage.getItem(KEY); } catch (error) { return null; }
  }
  function effective() { return root.dataset.theme || (system.matches ? "dark" : "light"); }

  const saved = stored();
  if (saved === "dark" || saved === "light") root.dataset.theme = saved;

  document.addEventListener("DOMContentLoaded", function () {
    const button = document.getElementById("theme-toggle");
    if (!button) return;
    function show() { button.setAttribute("aria-pressed", String(effective() === "dark")); }
    button.hidden = false;  // without JS there is no toggle, and the system's choice applies
    show();
    system.addEventListener("change", show);
    button.addEventListener("click", function () {
      const next = effective() === "dark" ? "light" : "dark";
      root.dataset.theme = next;
      try { localStorage.setItem(KEY, next); } catch (error) { /* private mode: this page only */ }
      show();
    });
  });
})();
