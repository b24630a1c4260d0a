// "Simulate (exact, FSDP2)" without leaving the page: post the inputs as JSON (CSRF header from the
// page's meta tag), poll the simulation, then swap in the server-rendered answer with its simulated
// column. Without JS the form posts normally and the page comes back with the simulation queued.
// Plain JS, no library; the form is found by delegation, since the answer it sits in is replaced.
(function () {
  "use strict";
  const POLL_MS = 1000;
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const results = document.getElementById("plan-results");
  if (!results) return;

  function form() { return document.getElementById("simulate-form"); }
  function statusLine() { return document.getElementById("simulation-status"); }
  function say(text) { const status = statusLine(); if (status) status.textContent = text; }
  function busy(on) { const f = form(); if (f) f.querySelector("button[type=submit]").disabled = on; }

  function describe(run) {
    if (run.status === "queued") {
      const ahead = run.queue_position || 0;
      return "Simulation #" + run.run_id + " is queued" + (ahead ? " (" + ahead + " ahead)" : "") + "…";
    }
    if (run.status === "running" && run.unstored) {
      return "Simulation #" + run.run_id + " finished, but the database has not taken its result yet (" +
        run.unstored + "); it is stored as soon as it does.";
    }
    if (run.status === "running") {
      const about = run.expected_s ? " of about " + Math.round(run.expected_s) + " s" : "";
      return "Simulation #" + run.run_id + " is running… " + Math.round(run.elapsed_s || 0) + " s" + about;
    }
    if (run.status === "done") return "Simulation #" + run.run_id + " done in " + (run.elapsed_s || 0).toFixed(1) + " s.";
    return "Simulation #" + run.run_id + " failed: " + String(run.error || "").split("\n")[0];
  }

  // Only the status line is live: the answer is swapped in silently, and where focus was in it (on the
  // status line, since the submit) it goes to the new status line, which then says how the run ended.
  async function refresh(url, message) {
    const response = await fetch(url, { headers: { Accept: "text/html" } });
    if (response.ok) {
      const focused = results.contains(document.activeElement);
      results.innerHTML = await response.text();  // rendered and escaped by the server
      say(message);
      const status = statusLine();
      if (focused && status) status.focus();
    }
  }

  async function follow(statusUrl, resultsUrl) {
    busy(true);
    try {
      for (;;) {
        const response = await fetch(statusUrl, { headers: { Accept: "application/json" } });
        if (!response.ok) { say("Could not read the simulation's status (HTTP " + response.status + ")."); busy(false); return; }
        const run = await response.json();
        say(describe(run));
        if (run.status === "done" || run.status === "failed") { await refresh(resultsUrl, describe(run)); return; }
        await new Promise(function (resolve) { setTimeout(resolve, POLL_MS); });
      }
    } catch (error) {
      say("Lost contact with the server (" + error.message + "); reload to see the simulation.");
      busy(false);
    }
  }

  document.addEventListener("submit", async function (event) {
    const f = event.target;
    if (f.id !== "simulate-form") return;
    event.preventDefault();
    const body = {};
    for (const [name, value] of new FormData(f)) if (name !== "csrf_token") body[name] = String(value);
    say("Queuing…");
    // Focus the status line before the button is disabled: a disabled button drops focus to <body>.
    const status = statusLine();
    if (status) status.focus();
    busy(true);
    try {
      const response = await fetch(f.action, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json", "X-CSRF-Token": token },
        body: JSON.stringify(body),
      });
      const answer = await response.json();
      if (response.status !== 202) { say(answer.error || "Refused (HTTP " + response.status + ")."); busy(false); return; }
      await follow(answer.url, f.dataset.resultsUrl);
    } catch (error) {
      say("Could not start the simulation (" + error.message + ").");
      busy(false);
    }
  });

  const f = form();
  if (f && f.dataset.activeRun) follow(f.dataset.activeRun, f.dataset.resultsUrl);  // one under way: follow it
})();
