// Keyboard shortcuts for every page: pressing a key activates the element whose data-key
// names it (radio buttons get checked, buttons and links clicked). On a form marked
// data-enter-submits, Enter submits it, or says what is missing (no choice yet). Plain JS, no library.
(function () {
  "use strict";
  let submitted = false;

  function typingIn(element) {
    if (!element || !element.tagName) return false;
    if (element.isContentEditable || element.tagName === "TEXTAREA" || element.tagName === "SELECT") return true;
    return element.tagName === "INPUT" && !["radio", "checkbox", "button", "submit"].includes(element.type);
  }

  // On window, so it runs after every form's and the document's own submit handlers: a submit that
  // the page's script took over (preventDefault: a lab run, a simulation) leaves the page, and its keys, live.
  window.addEventListener("submit", function (event) { if (!event.defaultPrevented) submitted = true; });
  // Back/forward restores the page from cache with its old state: make its keys live again.
  window.addEventListener("pageshow", function () { submitted = false; });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typingIn(event.target)) return;
    if (submitted) { event.preventDefault(); return; }  // one answer per page: no double grades
    if (event.key === "Enter") {
      if (event.target.tagName === "BUTTON" || event.target.tagName === "A") return;  // their own Enter
      const form = document.querySelector("form[data-enter-submits]");
      if (form) {
        // requestSubmit validates first, as the form's button does: with nothing chosen yet it says
        // so and focuses the choices, where doing nothing would leave Enter looking broken.
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    const element = document.querySelector('[data-key="' + CSS.escape(event.key) + '"]');
    if (!element) return;
    event.preventDefault();
    if (element.type === "radio") {
      element.checked = true;
      element.focus();
    } else {
      element.click();
    }
  });
})();
