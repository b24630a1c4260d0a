// Keyboard shortcuts for every page: pressing a key activates the element whose data-key
// names it (radio buttons get checked, buttons and links clicked). On a form marked
// data-enter-submits, Enter submits it, or says what is missing (no choice yet). Plain JS, no library.
(function () {
  "use strict";
  let submitted = false;
  const changed = new WeakSet();  // forms (or form-less controls) the user has changed

  function typingIn(element) {
    if (!element || !element.tagName) return false;
    if (element.isContentEditable || element.tagName === "TEXTAREA" || element.tagName === "SELECT") return true;
    return element.tagName === "INPUT" && !["radio", "checkbox", "button", "submit"].includes(element.type);
  }

  // A key pressed in a form the user has changed acts only on that form's own controls (the study
  // choices' digits): a shortcut that leaves the page (h on a ticked checkbox) would lose the entries.
  function keptFrom(element, focused) {
    const scope = focused && focused.form !== undefined ? (focused.form || focused) : null;
    return scope !== null && changed.has(scope) && !scope.contains(element);
  }

  // On window, so it runs after every form's and the document's own submit handlers: a submit that
  // the page's script took over (preventDefault: a lab run, a simulation) leaves the page, and its keys, live.
  window.addEventListener("submit", function (event) { if (!event.defaultPrevented) submitted = true; });
  // Back/forward restores the page from cache with its old state: make its keys live again.
  window.addEventListener("pageshow", function () { submitted = false; });
  for (const type of ["input", "change"]) {
    document.addEventListener(type, function (event) {
      if (event.target.form !== undefined) changed.add(event.target.form || event.target);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    // Every shortcut says its key to assistive technology (where the page did not already).
    for (const element of document.querySelectorAll("[data-key]:not([aria-keyshortcuts])")) {
      element.setAttribute("aria-keyshortcuts", element.dataset.key);
    }
    // A message present at load is in no live region's change: focus it, so it is read out and Tab
    // goes on from there. A control the page focuses itself (autofocus: the first grade) comes first.
    const flash = document.querySelector(".flash");
    if (flash && !document.querySelector("[autofocus]")) flash.focus();
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typingIn(event.target)) return;
    const element = event.key === "Enter" ? null : document.querySelector('[data-key="' + CSS.escape(event.key) + '"]');
    if (submitted) {
      // One answer per page (no double grades): once a form is sent, no shortcut, and no Enter or
      // Space on a focused button, until the next page. Tab, arrows and the rest still move.
      if (element || event.key === "Enter" || event.key === " ") event.preventDefault();
      return;
    }
    if (event.key === "Enter") {
      // A held Enter's auto-repeat reaches the next page too: it must not press the control focused there.
      if (event.repeat) { event.preventDefault(); return; }
      if (event.target.tagName === "BUTTON" || event.target.tagName === "A") return;  // their own Enter
      const form = document.querySelector("form[data-enter-submits]");
      if (form && !keptFrom(form, event.target)) {
        // requestSubmit validates first, as the form's button does: with nothing chosen yet it says
        // so and focuses the choices, where doing nothing would leave Enter looking broken.
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    if (!element) {
      // A digit the page has no shortcut for: say which apply where the page has a hint for it.
      const hint = /^[0-9]$/.test(event.key) && document.querySelector("[data-digit-hint]");
      if (hint) hint.textContent = hint.dataset.digitHint;
      return;
    }
    if (keptFrom(element, event.target)) return;
    event.preventDefault();
    if (element.type === "radio") {
      element.checked = true;
      element.focus();
    } else {
      element.click();
    }
  });
})();
