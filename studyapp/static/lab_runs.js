// "Run this lab" without leaving the page: post the form as JSON-accepting fetch (CSRF header from
// the page's meta tag), poll the run, then swap in the server-rendered results. Without JS the form
// posts normally and the page comes back with the run queued. Plain JS, no library.
(function () {
  "use strict";
  const form = document.getElementById("run-lab");
  if (!form) return;
  const status = document.getElementById("run-status");
  const button = form.querySelector("button[type=submit]");
  const results = document.getElementById("lab-results");
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const POLL_MS = 1000;

  function say(text) { status.textContent = text; }

  function describe(run) {
    if (run.status === "queued") {
      const ahead = run.queue_position || 0;
      return "Run #" + run.run_id + " is queued" + (ahead ? " (" + ahead + " ahead)" : "") + "…";
    }
    if (run.status === "running" && run.unstored) {
      return "Run #" + run.run_id + " finished, but the database has not taken its result yet (" + run.unstored +
        "); it is stored as soon as it does.";
    }
    if (run.status === "running") {
      const about = run.expected_s ? " of about " + Math.round(run.expected_s) + " s (the last run's time)" : "";
      return "Run #" + run.run_id + " is running… " + Math.round(run.elapsed_s || 0) + " s" + about;
    }
    if (run.status === "done") return "Run #" + run.run_id + " done in " + (run.elapsed_s || 0).toFixed(1) + " s: the claim " + (run.result && run.result.holds ? "held." : "did NOT hold.");
    return "Run #" + run.run_id + " failed: " + String(run.error || "").split("\n")[0];
  }

  async function refreshResults() {
    const response = await fetch(form.dataset.resultsUrl, { headers: { Accept: "text/html" } });
    if (response.ok) results.innerHTML = await response.text();  // rendered and escaped by the server
  }

  async function follow(url) {
    button.disabled = true;
    try {
      for (;;) {
        const response = await fetch(url, { headers: { Accept: "application/json" } });
        if (!response.ok) { say("Could not read the run's status (HTTP " + response.status + ")."); return; }
        const run = await response.json();
        say(describe(run));
        if (run.status === "done" || run.status === "failed") { await refreshResults(); return; }
        await new Promise(function (resolve) { setTimeout(resolve, POLL_MS); });
      }
    } catch (error) {
      say("Lost contact with the server (" + error.message + "); reload to see the run.");
    } finally {
      button.disabled = false;
    }
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    say("Queuing…");
    // Focus the status line before the button is disabled: a disabled button drops focus to <body>.
    // It stays there through the run (outside #lab-results), and Tab goes on to the result.
    status.focus();
    button.disabled = true;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json", "X-CSRF-Token": token },
        body: JSON.stringify({ world_size: Number(form.elements.world_size.value), device: form.elements.device.value }),
      });
      const body = await response.json();
      if (response.status !== 202) { say(body.error || "The run was refused (HTTP " + response.status + ")."); button.disabled = false; return; }
      await follow(body.url);
    } catch (error) {
      say("Could not start the run (" + error.message + ").");
      button.disabled = false;
    }
  });

  if (form.dataset.activeRun) follow(form.dataset.activeRun);  // a run already under way: follow it

  // While the lab process is still being asked for GPUs, ask the server again each second and swap in
  // the device choice and its notes once it has answered (the choice made meanwhile is kept). The
  // detection itself gives up after 60 s, so the polling stops soon after.
  const deviceNotes = document.getElementById("lab-devices");
  const deviceChoice = document.getElementById("device-choice");
  const DEVICE_POLLS = 90;

  function devicesUnknown(why) {
    deviceNotes.textContent = "";
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = "Could not learn whether CUDA can be chosen (" + why + "); reload to ask again. Labs run on CPU ranks meanwhile.";
    deviceNotes.appendChild(note);
  }

  async function awaitDevices(url) {
    for (let poll = 0; poll < DEVICE_POLLS; poll++) {
      await new Promise(function (resolve) { setTimeout(resolve, POLL_MS); });
      let answer;
      try {
        const response = await fetch(url, { headers: { Accept: "application/json" } });
        if (!response.ok) { devicesUnknown("HTTP " + response.status); return; }
        answer = await response.json();
      } catch (error) {
        devicesUnknown("lost contact with the server: " + error.message);
        return;
      }
      if (answer.pending) continue;
      const chosen = deviceChoice.value;
      deviceChoice.innerHTML = answer.options;  // rendered and escaped by the server
      if (Array.from(deviceChoice.options).some(function (option) { return option.value === chosen; })) deviceChoice.value = chosen;
      deviceNotes.innerHTML = answer.notes;
      return;
    }
    devicesUnknown("no answer after about " + DEVICE_POLLS + " s");
  }

  if (deviceNotes && deviceChoice && deviceNotes.dataset.devicesUrl) awaitDevices(deviceNotes.dataset.devicesUrl);
})();
