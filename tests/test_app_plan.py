"""The "Will it fit?" page through the test client: the figures are the planner's (and, where it is simple,
worked out here by hand), the URL carries every input, bad input is a 400 naming the field, and the
simulation is a job the lab worker runs (here a fake CLI; one slow test runs the real one)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from conftest import DatabaseOnSmallDisk, csrf_token_of, filling_first
from live_server import wait_for
from sqlmodel import Session, select

from sharding_lab.planner import Category, Mesh, ModelShape, PlanRequest, plan_analytic
from sharding_lab.strategies import STRATEGIES, Strategy
from sharding_lab.units import human_bytes
from studyapp.db import get_engine
from studyapp.lab_runs import LabWorker, RunStatus, latest_done, start_worker
from studyapp.lab_runs.plan_runs import plan_argv, simulation_params
from studyapp.lab_runs.queue import PLAN_SIMULATION
from studyapp.models import LabRun
from studyapp.plan_chart import ChartBar, memory_chart
from studyapp.safe_svg import clean_svg

# gpt2-small untied at 8 GPUs: every parameter's dim 0 divides by 8, so FSDP2 pads nothing and Ψ/N is exact.
GPT2 = {"size": "gpt2-small", "gpus": "8", "gpu_memory_gb": "80", "headroom": "10", "micro_batch": "2", "seq": "512",
        "strategy": "zero3", "grad_accum": "1"}
V, T, C, L = 50304, 1024, 768, 12  # gpt2-small: vocabulary, positions, width, blocks
PSI = 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # wte + lm_head, wpe, blocks, ln_f
TENSORS = 12 * L + 5  # 12 per block; wte, wpe, ln_f weight and bias, lm_head
N = 8


def page(client, query: dict | str) -> tuple[int, str]:
    response = client.get("/plan?" + (query if isinstance(query, str) else urlencode(query)))
    return response.status_code, response.get_data(as_text=True)


def cell_bytes(text: str, cell_id: str) -> int:
    match = re.search(rf'id="{re.escape(cell_id)}"[^>]*>\s*(?:<strong>)?<data value="(\d+)"', text)
    assert match, f"no figure in #{cell_id}"
    return int(match.group(1))


def input_value(text: str, name: str) -> str:
    match = re.search(rf'<input id="{name}" name="{name}" type="text"[^>]*value="([^"]*)"', text)
    assert match, name
    return html.unescape(match.group(1))


def is_checked(text: str, name: str) -> bool:
    tag = re.search(rf'<input id="{name}" name="{name}" type="checkbox"[^>]*>', text).group(0)
    return " checked" in tag


def selected(text: str, name: str) -> str:
    select_html = re.search(rf'<select id="{name}" name="{name}".*?</select>', text, re.S).group(0)
    return re.search(r'<option value="([^"]+)" selected>', select_html).group(1)


def test_the_default_page_answers_at_once_for_every_strategy(client):
    status, text = page(client, "")
    assert status == 200
    for name in ("size", "layers", "width", "heads", "vocab", "seq_len", "gpus", "mesh", "gpu_memory_gb", "headroom",
                 "micro_batch", "seq", "strategy", "grad_accum", "tied", "mixed_precision",
                 "activation_checkpointing", "cpu_offload"):
        assert f'<label for="{name}">' in text, f"{name} has no label"
    assert selected(text, "size") == "7b" and input_value(text, "gpus") == "64"
    request = PlanRequest(ModelShape.named("7b"), Mesh.of(64), 80, strategy="zero3")
    plan = plan_analytic(request)
    assert cell_bytes(text, "analytic-zero3-total") == plan.peak.total
    verdict = re.search(r'<p class="verdict [^"]+" id="verdict">(.*?)</p>', text, re.S).group(1)
    assert ("zero3: fits." if plan.fits else "zero3: does NOT fit.") in verdict
    assert f'<strong id="largest-micro-batch">{plan.largest_micro_batch}</strong>' in text
    for strategy in STRATEGIES:
        assert f'id="analytic-{strategy}-total"' in text
    # DDP's replica of 7b's model states alone, 16 B per parameter, is beyond 72 GB: not even 1 fits.
    assert 16 * plan.num_params > request.usable_bytes
    assert 'id="analytic-ddp-largest">none<' in text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="chart plan-chart"' in text
    assert "What these figures leave out" in text and "Wire bytes (derived)" in text
    assert text.count('<span class="method">analytic</span>') >= 3  # verdict, memory table, communication


def test_the_figures_are_the_planners_and_the_simple_ones_hold_by_hand(client):
    status, text = page(client, GPT2)
    assert status == 200
    for strategy in STRATEGIES:
        plan = plan_analytic(PlanRequest(ModelShape.named("gpt2-small"), Mesh.of(N), 80, micro_batch=2, seq=512,
                                         strategy=strategy))
        assert plan.num_params == PSI
        for category in Category:
            assert cell_bytes(text, f"analytic-{strategy}-{category}") == plan.peak[category].bytes, (strategy, category)
        assert cell_bytes(text, f"analytic-{strategy}-total") == plan.peak.total
        fits = re.search(rf'id="analytic-{strategy}-fits"[^>]*>(\w+)<', text).group(1)
        assert fits == ("yes" if plan.fits else "no")
        assert f'id="analytic-{strategy}-largest">{plan.largest_micro_batch}<' in text

    # By hand: DDP keeps every model state whole, fp32: 4 + 4 + 8 bytes per parameter, and Adam's
    # 4-byte step counter per tensor: 16Ψ + 4·tensors.
    assert cell_bytes(text, "analytic-ddp-parameters") == 4 * PSI
    assert cell_bytes(text, "analytic-ddp-gradients") == 4 * PSI
    assert cell_bytes(text, "analytic-ddp-optimizer_state") == 8 * PSI + 4 * TENSORS
    # zero2 and zero3 shard Adam's state: 8Ψ/N (no padding at N=8), counters whole.
    for strategy in ("zero2", "zero3"):
        assert cell_bytes(text, f"analytic-{strategy}-optimizer_state") == 8 * PSI // N + 4 * TENSORS

    # Communication, fp32 zero3 at N=8: forward all-gathers 4Ψ, backward all-gathers the blocks again,
    # reduce-scatter 4Ψ; a ring moves (N-1)/N of each. DDP all-reduces 4Ψ, its ring 2(N-1)/N.
    rows = re.findall(r'<tr class="[^"]*" data-strategy="(\w+)">(.*?)</tr>', text, re.S)
    comm = {}
    for strategy, row in rows:
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        values = [int(v) for v in re.findall(r'<data value="(\d+)"', row)]
        comm[(strategy, cells[1], cells[2])] = (cells[3], values[0], values[1])
    block = 12 * C * C + 13 * C
    assert comm[("zero3", "all-gather", "forward")] == ("dp (8 ranks)", 4 * PSI, 4 * PSI * 7 // 8)
    assert comm[("zero3", "all-gather", "backward")] == ("dp (8 ranks)", 4 * L * block, 4 * L * block * 7 // 8)
    assert comm[("zero3", "reduce-scatter", "backward")] == ("dp (8 ranks)", 4 * PSI, 4 * PSI * 7 // 8)
    assert comm[("ddp", "all-reduce", "backward")] == ("dp (8 ranks)", 4 * PSI, 2 * 4 * PSI * 7 // 8)
    assert "derived" in rows[0][1]


def test_an_hsdp_mesh_puts_each_collective_on_its_mesh_dimension(client):
    status, text = page(client, {**GPT2, "gpus": "16", "mesh": "2x8", "mixed_precision": "on"})
    assert status == 200
    zero3 = [row for strategy, row in re.findall(r'data-strategy="(\w+)">(.*?)</tr>', text, re.S) if strategy == "zero3"]
    dims = {re.findall(r"<td>(.*?)</td>", row)[1]: re.findall(r"<td>(.*?)</td>", row)[3] for row in zero3}
    assert dims["reduce-scatter"] == "shard (8 ranks)" and dims["all-reduce"] == "replicate (2 ranks)"
    assert "not applicable: a replicas x shards mesh is HSDP" in text  # ddp and zero1 cannot run it


def test_a_mesh_alone_says_how_many_gpus(client):
    status, text = page(client, {**GPT2, "gpus": "", "mesh": "2x8"})
    assert status == 200
    assert input_value(text, "gpus") == "16"
    request = PlanRequest(ModelShape.named("gpt2-small"), Mesh(shards=8, replicas=2), 80, micro_batch=2, seq=512,
                          strategy="zero3")
    assert cell_bytes(text, "analytic-zero3-total") == plan_analytic(request).peak.total
    status, text = page(client, {**GPT2, "gpus": "", "mesh": "1000x1000"})
    assert status == 400 and "HSDP mesh 1000x1000 is 1,000,000 GPUs, more than 131,072." in text


def test_the_url_carries_every_input_and_the_form_shows_them_again(client):
    query = {"size": "custom", "layers": "6", "width": "512", "heads": "8", "vocab": "32000", "seq_len": "1024",
             "tied": "on", "gpus": "16", "mesh": "4x4", "gpu_memory_gb": "141", "headroom": "15", "micro_batch": "3",
             "seq": "256", "strategy": "zero2", "grad_accum": "4", "mixed_precision": "on",
             "activation_checkpointing": "on", "cpu_offload": "on"}
    status, text = page(client, query)
    assert status == 200
    for name in ("layers", "width", "heads", "vocab", "seq_len", "gpus", "mesh", "gpu_memory_gb", "headroom",
                 "micro_batch", "seq", "grad_accum"):
        assert input_value(text, name) == query[name], name
    assert selected(text, "size") == "custom" and selected(text, "strategy") == "zero2"
    for name in ("tied", "mixed_precision", "activation_checkpointing", "cpu_offload"):
        assert is_checked(text, name), name
    # The answer is for exactly these inputs ...
    request = PlanRequest(ModelShape(6, 512, 8, 32000, 1024, tied=True), Mesh(shards=4, replicas=4), 141,
                          micro_batch=3, seq=256, strategy="zero2", mixed_precision=True,
                          activation_checkpointing=True, cpu_offload=True, grad_accum_steps=4, headroom=0.15)
    assert cell_bytes(text, "analytic-zero2-total") == plan_analytic(request).peak.total
    # ... and the links the page makes carry them all.
    results_url = html.unescape(re.search(r'data-results-url="([^"]+)"', text).group(1))
    assert {k: v[0] for k, v in parse_qs(urlsplit(results_url).query).items()} == query
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', text))
    hidden.pop("csrf_token")
    assert hidden == query


def test_defaults_fill_what_the_url_leaves_out_and_flags_off_mean_off(client):
    status, text = page(client, {"size": "1b", "gpus": "8"})
    assert status == 200
    assert input_value(text, "gpu_memory_gb") == "80" and input_value(text, "micro_batch") == "1"
    assert input_value(text, "layers") == "20"  # a named size shows its own shape
    assert not is_checked(text, "mixed_precision")
    assert "1b (20 layers x 2048 wide" in text


@pytest.mark.parametrize(
    ("query", "field", "phrase"),
    [
        ({"size": "custom", "width": "100", "heads": "3"}, "heads", "Heads (3) must divide the width (100)"),
        ({"gpus": "8", "mesh": "2x2"}, "mesh", "HSDP mesh 2x2 is 4 GPUs, but GPUs is 8"),
        ({"mesh": "two by four"}, "mesh", "must be REPLICASxSHARDS"),
        ({"micro_batch": "-2"}, "micro_batch", "Micro-batch must be a whole number from 1 to"),
        ({"gpus": "0"}, "gpus", "GPUs must be from 1 to 131,072, got 0"),
        ({"gpu_memory_gb": "-80"}, "gpu_memory_gb", "GPU memory (GB) must be positive"),
        ({"gpu_memory_gb": "lots"}, "gpu_memory_gb", "GPU memory (GB) must be a number, got &#39;lots&#39;"),
        ({"gpu_memory_gb": "nan"}, "gpu_memory_gb", "GPU memory (GB) must be a number"),
        ({"gpu_memory_gb": "٨٠"}, "gpu_memory_gb", "GPU memory (GB) must be a number"),  # as gpus=٨ is refused
        # Python's float() takes digit separators; the page refuses them, as it refuses 80,5 and 0x50.
        ({"gpu_memory_gb": "1_000"}, "gpu_memory_gb", "GPU memory (GB) must be a number, got &#39;1_000&#39;."),
        ({"headroom": "1_0"}, "headroom", "Headroom (%) must be a number, got &#39;1_0&#39;."),
        ({"headroom": "100"}, "headroom", "Headroom (%) must be from 0 to 99"),
        ({"headroom": "99.0000001"}, "headroom", "from 0 to 99, got 99.0000001."),  # not "got 99"
        ({"layers": "12.5", "size": "custom"}, "layers", "Layers must be a whole number"),
        ({"gpus": ""}, "gpus", "GPUs is required"),
        ({"strategy": "ddp", "cpu_offload": "on"}, "cpu_offload", "CPU offload is FSDP2&#39;s (zero2, zero3): ddp"),
        ({"strategy": "zero1", "gpus": "16", "mesh": "2x8"}, "mesh", "HSDP mesh (replicas &gt; 1) is FSDP2&#39;s"),
        ({"size": "custom", "seq_len": "128", "seq": "512"}, "seq", "Sequence (512) exceeds the model&#39;s sequence length (128)"),
        ({"size": "13b"}, "size", "Model must be one of tiny, mini"),
        ({"strategy": "fsdp9"}, "strategy", "Your strategy must be one of ddp, zero1, zero2, zero3"),
        ({"tied": "maybe"}, "tied", "is a checkbox"),
        ({"vocab": "9" * 40, "size": "custom"}, "vocab", "Vocabulary must be a whole number"),
        ({"mesh": "1000x1000"}, "mesh", "HSDP mesh 1000x1000 is 1,000,000 GPUs, but GPUs is 8"),  # separators
    ],
)
def test_bad_input_is_a_400_that_names_the_field(client, query, field, phrase):
    status, text = page(client, {**GPT2, **query})
    assert status == 400
    assert "Traceback" not in text
    error = re.search(rf'<span class="field-error" id="{field}-error">(.*?)</span>', text, re.S)
    assert error and phrase in error.group(1), text[text.find("plan-errors"):][:800]
    assert re.search(rf'<input id="{field}"[^>]*aria-invalid="true"|<select id="{field}"[^>]*aria-invalid="true"', text)
    assert f'<a href="#{field}">' in text  # the summary links to the field
    assert 'id="memory-table"' not in text  # no answer for a wrong question
    partial = client.get("/plan/results?" + urlencode({**GPT2, **query}))
    assert partial.status_code == 400 and phrase in partial.get_data(as_text=True)


def test_a_decimal_gpu_memory_is_planned_as_typed_not_rounded_to_six_digits(client):
    # 2.0160642 GB less 10% is 2,016,064,200 x 9 // 10 bytes usable, just above gpt2-small zero3's peak here;
    # rounded to 2.01606 GB it would be 1,814,454,000 and the verdict would flip.
    usable = 2_016_064_200 * 9 // 10
    status, text = page(client, {**GPT2, "gpu_memory_gb": "2.0160642"})
    assert status == 200
    assert input_value(text, "gpu_memory_gb") == "2.0160642"
    verdict = re.search(r'id="verdict">(.*?)</p>', text, re.S).group(1)
    peak, shown_usable = (int(v) for v in re.findall(r'<data value="(\d+)"', verdict))
    assert shown_usable == usable and peak <= usable
    assert "zero3: fits." in verdict and "(2.0160642 GB less 10% headroom)" in verdict
    assert "against 2.0160642 GB per GPU" in text  # the chart's title
    assert input_value(page(client, {**GPT2, "headroom": "-0"})[1], "headroom") == "0"


def test_a_field_given_twice_differently_is_a_400_naming_it(client):
    status, text = page(client, urlencode(GPT2) + "&gpus=16")
    assert status == 400
    error = re.search(r'<span class="field-error" id="gpus-error">(.*?)</span>', text, re.S).group(1)
    assert html.unescape(error) == "GPUs is given 2 different ways ('8', '16'): give it once."
    status, text = page(client, urlencode({**GPT2, "gpus": "", "mesh": "2x8"}) + "&gpus=16")
    assert status == 400 and 'id="gpus-error"' in text  # the mesh filling an empty GPUs does not hide it
    assert page(client, urlencode(GPT2) + "&gpus=8")[0] == 200  # the same value twice is one question


def test_the_chart_stacks_each_strategy_against_the_gpu_lines_and_is_a_plain_chart():
    bars = [ChartBar("ddp", {"parameters": 60, "gradients": 40}), ChartBar("zero3", {"parameters": 10, "activations": 20}),
            ChartBar("zero3 sim", {"parameters": 11, "activations": 20}, "simulated")]
    svg = str(memory_chart(bars, ["parameters", "gradients", "activations"], gpu_bytes=80, usable_bytes=72, title="t <&>"))
    clean_svg(svg)  # only what studyapp.safe_svg allows: it would pass the stored-chart check
    assert "t &lt;&amp;&gt;" in svg
    assert len(re.findall(r"<rect [^>]*><title>", svg)) == 6  # one segment per nonzero part: 2 + 2 + 2
    # The axis runs to max(tallest, GPU) x 1.08 = 108 over 200 px: the GPU line sits at 80/108 of the height.
    gpu_y = float(re.search(r'<line [^>]*y1="([\d.]+)"[^>]*class="axis gpu-line"[^>]*><title>GPU memory', svg).group(1))
    assert gpu_y == pytest.approx(240 - 200 * 80 / 108, abs=0.1)
    assert 'stroke-dasharray="6 4"><title>usable' in svg and "dashed outline" in svg
    # A bar far past the GPU is cut at 2.5x and marked.
    tall = str(memory_chart([ChartBar("ddp", {"parameters": 1000})], ["parameters"], gpu_bytes=80, usable_bytes=72, title="t"))
    assert "▲ " in tall


# --- the simulation ----------------------------------------------------------------------------------

FAKE_CLI = textwrap.dedent('''
    import json, sys
    argv = sys.argv[1:]
    with open(sys.argv[0] + ".argv", "w") as out:
        json.dump(argv, out)
    peak = {"parameters": 100, "gradients": 200, "optimizer_state": 300, "activations": 400, "temporaries": 5,
            "all_gather_buffers": 6, "reduce_scatter_buffers": 7}
    simulated = {"method": "simulation", "peak": {"moment": "the tracker's global peak", "total_bytes": sum(peak.values()),
                 "categories": {k: {"bytes": v, "holds": "fake"} for k, v in peak.items()}, "host_bytes": 0},
                 "holds": "the fake simulator", "leaves_out": ["everything: it is a fake"]}
    print(json.dumps({"strategies": {"ddp": {"simulation": {"unavailable": "simulation not available for ddp"}},
                                     "zero3": {"simulation": simulated}}}, indent=2))
''')


@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    script = tmp_path / "fake_plan_cli.py"
    script.write_text(FAKE_CLI, encoding="utf-8")
    return script


@pytest.fixture
def app_config(app_config: dict, tmp_path: Path) -> dict:
    script = tmp_path / "fake_plan_cli.py"
    return {**app_config, "PLAN_SIMULATION_COMMAND": [sys.executable, str(script)]}


def plan_runs(app) -> list[LabRun]:
    with Session(get_engine(app)) as session:
        return list(session.exec(select(LabRun).where(LabRun.lab_id == PLAN_SIMULATION)).all())


def test_simulate_queues_a_job_the_worker_runs_and_the_page_shows_it_beside_the_analytic(app, client, fake_cli):
    token = csrf_token_of(client)
    status, text = page(client, GPT2)
    assert "Simulate (exact, FSDP2)" in text and 'id="simulated-table"' not in text

    response = client.post("/plan/simulations", json=GPT2, headers={"X-CSRF-Token": token, "Accept": "application/json"})
    assert response.status_code == 202
    url = response.get_json()["url"]
    again = client.post("/plan/simulations", json={**GPT2, "gpu_memory_gb": "141", "strategy": "zero2"},
                        headers={"X-CSRF-Token": token, "Accept": "application/json"})
    assert again.get_json()["run_id"] == response.get_json()["run_id"]  # GPU memory and strategy do not change it
    (run,) = plan_runs(app)
    assert run.status == RunStatus.queued  # the web process ran nothing
    assert run.params == simulation_params({**GPT2, "seq_len": "1024", "layers": "12", "width": "768", "heads": "12",
                                            "vocab": "50304", "mesh": ""})
    assert client.get(url).get_json()["status"] == "queued"

    finished = LabWorker(app).run_until_over(run.id)
    assert finished.status == RunStatus.done, finished.error
    argv = json.loads(Path(str(fake_cli) + ".argv").read_text())
    assert argv == ["plan", "--size", "gpt2-small", "--gpus", "8", "--micro-batch", "2", "--grad-accum", "1",
                    "--seq", "512", "--strategy", "all", "--simulate", "--json"]
    assert client.get(url).get_json()["status"] == "done"

    status, text = page(client, GPT2)
    assert status == 200
    assert cell_bytes(text, "simulated-zero3-activations") == 400
    assert cell_bytes(text, "simulated-zero3-total") == 1018
    assert re.search(r'id="simulated-zero3-fits">yes<', text)
    assert "zero3 sim" in text  # its bar in the chart
    # The fake's categories are nothing like the analytic model's: each difference is named, none hidden.
    assert re.search(r'id="filing-zero3">zero3: the categories differ, analytic against simulated: parameters [\d.]+ MB '
                     r'more, gradients', text)
    assert "everything: it is a fake" in text  # what the simulation leaves out
    assert "Simulate again (exact, FSDP2)" in text
    # Simulations are not lab findings: nothing reaches the labs' pages or the Anki export.
    with Session(get_engine(app)) as session:
        assert PLAN_SIMULATION not in latest_done(session)


class TestAFullDisk(DatabaseOnSmallDisk):
    """The simulation (a fake) fills the database's disk before it answers."""

    @pytest.fixture
    def app_config(self, app_config: dict, small_disk) -> dict:
        return {**app_config, "PLAN_SIMULATION_COMMAND": filling_first(app_config["PLAN_SIMULATION_COMMAND"], small_disk)}

    def test_a_result_waiting_for_space_says_so_and_is_stored_once_space_is_back(self, app, client, small_disk,
                                                                                  fake_cli):
        url = client.post("/plan/simulations", json=GPT2,
                          headers={"X-CSRF-Token": csrf_token_of(client), "Accept": "application/json"}).get_json()["url"]
        worker = start_worker(app)
        try:
            waiting = wait_for(lambda: (body := client.get(url).get_json()).get("unstored") and body, 30, "the refusal")
            assert waiting["status"] == "running" and waiting["result"] is None
            assert waiting["unstored"] == ("database or disk is full: the disk that holds the database is full: free "
                                           "space on it, then try again")
            (small_disk / "filler").unlink()
            done = wait_for(lambda: (body := client.get(url).get_json())["status"] == "done" and body, 20, "the result")
        finally:
            worker.stop()
        assert "unstored" not in done and done["result"]["simulations"]["zero3"]["holds"] == "the fake simulator"


def test_a_form_post_without_js_queues_and_comes_back_to_the_same_question(app, client, fake_cli):
    token = csrf_token_of(client)
    response = client.post("/plan/simulations", data={**GPT2, "csrf_token": token})
    assert response.status_code == 303
    back = urlsplit(response.headers["Location"])
    assert back.path == "/plan" and {k: v[0] for k, v in parse_qs(back.query).items()} == {
        **GPT2, "layers": "12", "width": "768", "heads": "12", "vocab": "50304", "seq_len": "1024"}
    text = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "Simulation #1 is queued" in text and "data-active-run=" in text


def test_simulate_refuses_bad_input_a_missing_token_and_what_it_cannot_simulate(app, client, fake_cli):
    token = csrf_token_of(client)
    headers = {"X-CSRF-Token": token, "Accept": "application/json"}
    assert client.post("/plan/simulations", json=GPT2).status_code == 400  # no CSRF token
    bad = client.post("/plan/simulations", json={**GPT2, "heads": "5", "size": "custom"}, headers=headers)
    assert bad.status_code == 400 and "Heads (5) must divide the width" in bad.get_json()["error"]
    assert client.post("/plan/simulations", json=[1], headers=headers).status_code == 400
    assert client.post("/plan/simulations", json={"gpus": 8}, headers=headers).status_code == 400
    offload = client.post("/plan/simulations", json={**GPT2, "cpu_offload": "on"}, headers=headers)
    assert offload.status_code == 400 and "CPU offload" in offload.get_json()["error"]
    assert "disabled" in page(client, {**GPT2, "cpu_offload": "on"})[1].split('id="simulate-form"')[1].split("</button>")[0]
    assert "disabled" not in page(client, {**GPT2, "tied": "on"})[1].split('id="simulate-form"')[1].split("</button>")[0]
    assert plan_runs(app) == []
    assert client.get("/plan/simulations/99").status_code == 404


@pytest.mark.parametrize("accept", [None, "text/html", "*/*"])
@pytest.mark.parametrize("run_id", ["99", "abc", "-1"])
def test_the_simulation_status_api_answers_json_whatever_the_accept_header(client, accept, run_id):
    # The login check treated the route as JSON, yet its 404 was an HTML page unless JSON was asked for
    # (and always for an id that was not a number: no route matched it).
    response = client.get(f"/plan/simulations/{run_id}", headers={"Accept": accept} if accept else {})
    assert (response.status_code, response.mimetype) == (404, "application/json")
    assert response.get_json() == {"error": f"There is no plan simulation {run_id}.", "status": 404}


def test_plan_argv_is_a_fixed_list_for_a_shape_and_a_mesh():
    params = simulation_params({"size": "custom", "layers": "2", "width": "64", "heads": "4", "vocab": "128",
                                "seq_len": "64", "tied": "", "gpus": "4", "mesh": "2x2", "micro_batch": "1",
                                "seq": "", "mixed_precision": "on", "activation_checkpointing": "",
                                "cpu_offload": "on", "grad_accum": "2"})
    assert plan_argv(["sl"], params) == [
        "sl", "plan", "--layers", "2", "--width", "64", "--heads", "4", "--vocab", "128", "--seq-len", "64",
        "--mesh", "2x2", "--micro-batch", "1", "--grad-accum", "2", "--mixed-precision", "--cpu-offload",
        "--strategy", "all", "--simulate", "--json"]
    with pytest.raises(ValueError):
        plan_argv(["sl"], {**params, "layers": "2; rm -rf /"})


def test_the_web_process_never_imports_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from studyapp import create_app
        app = create_app({{"TESTING": True, "DATABASE_URL": "sqlite:///{tmp_path}/t.db", "SECRET_KEY": "x"}},
                         instance_path="{tmp_path}/instance")
        client = app.test_client()
        assert client.get("/plan?size=70b&gpus=1024&mixed_precision=on").status_code == 200
        assert client.get("/plan?size=custom&heads=5").status_code == 400
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_real_simulation_by_the_worker_matches_the_cli(app_config, tmp_path, client, app):
    """The worker runs the real `sharding-lab plan --simulate` (FSDP2 on fake tensors, a few seconds)."""
    app.config["PLAN_SIMULATION_COMMAND"] = None
    query = {"size": "tiny", "gpus": "2", "micro_batch": "1", "strategy": "zero3", "grad_accum": "1"}
    token = csrf_token_of(client)
    response = client.post("/plan/simulations", json=query, headers={"X-CSRF-Token": token, "Accept": "application/json"})
    run = LabWorker(app).run_until_over(response.get_json()["run_id"])
    assert run.status == RunStatus.done, run.error
    cli = subprocess.run([sys.executable, "-m", "sharding_lab.cli", "plan", "--size", "tiny", "--gpus", "2",
                          "--strategy", "zero3", "--simulate", "--json"], capture_output=True, text=True, timeout=300)
    expected = json.loads(cli.stdout)["strategies"]["zero3"]["simulation"]["peak"]
    text = page(client, query)[1]
    assert cell_bytes(text, "simulated-zero3-total") == expected["total_bytes"]
    for category in Category:
        assert cell_bytes(text, f"simulated-zero3-{category}") == expected["categories"][str(category)]["bytes"]
    # tiny's peak is inside backward: the tracker files the unsharded gradients so far as temporaries.
    zero3 = json.loads(cli.stdout)["strategies"]["zero3"]
    analytic_grads = zero3["analytic"]["peak"]["categories"]["gradients"]["bytes"]
    moved = analytic_grads - expected["categories"]["gradients"]["bytes"]
    assert moved > 0 and zero3["categories_vs_simulation"].startswith(
        f"the categories differ only in filing: {human_bytes(moved)} of unsharded gradients")
    assert 1e3 <= moved < 1e6  # the page's decimal units: kB
    assert (f'id="filing-zero3">zero3: the categories differ only in filing: {moved / 1e3:.2f} kB of unsharded '
            "gradients") in html.unescape(text)
    assert Strategy.ZERO2 in run.result["simulations"]  # every strategy it can simulate, in one job


def test_decimal_bytes_round_as_printed():
    from studyapp.views.plan import decimal_bytes

    assert [decimal_bytes(v) for v in (999, 1_000, 994_999, 999_996, 12_712_122_648)] == [
        "999 B", "1.00 kB", "995.00 kB", "1.00 MB", "12.71 GB"]  # 999,996 B was "1000.00 kB"


def test_the_verdict_repeats_a_decimal_as_typed(client):
    # 0.0000001 GB is 100 B, 90 B usable after 10%: the verdict once read "(1e-07 GB less 10% headroom)".
    status, text = page(client, {**GPT2, "gpu_memory_gb": "0.0000001"})
    assert status == 200
    verdict = re.search(r'id="verdict">(.*?)</p>', text, re.S).group(1)
    assert "(0.0000001 GB less 10% headroom)" in verdict and re.findall(r'<data value="(\d+)"', verdict)[1] == "90"
    assert "against 0.0000001 GB per GPU" in text and input_value(text, "gpu_memory_gb") == "0.0000001"


def test_one_gpu_lists_only_the_collectives_pytorch_issues(client):
    # FSDP2 on one GPU gathers and reduce-scatters nothing (7b once showed 25.6 GiB of forward all-gathers).
    status, text = page(client, {**GPT2, "gpus": "1"})
    assert status == 200
    rows = re.findall(r'data-strategy="(\w+)">(.*?)</tr>', text, re.S)
    assert [(strategy, re.findall(r"<td[^>]*>(.*?)</td>", row)[1].split(" (")[0]) for strategy, row in rows] == [
        ("ddp", "all-reduce"), ("zero1", "all-reduce"), ("zero1", "broadcast"), ("zero2", "none"), ("zero3", "none")]
    assert 'id="comm-zero3-none">none (on a shard group of one GPU FSDP2 gathers and reduce-scatters nothing' in text
    # A mesh of 2 replicas x 1 shard: HSDP all-reduces each unit's fp32 gradients, 4Ψ, across the 2.
    status, text = page(client, {**GPT2, "gpus": "2", "mesh": "2x1"})
    zero3 = [row for strategy, row in re.findall(r'data-strategy="(\w+)">(.*?)</tr>', text, re.S) if strategy == "zero3"]
    assert len(zero3) == 1 and "<td>all-reduce</td>" in zero3[0] and "replicate (2 ranks)" in zero3[0]
    assert re.findall(r'<data value="(\d+)"', zero3[0]) == [str(4 * PSI), str(4 * PSI)]


def test_padding_that_makes_up_much_of_a_peak_is_said(client):
    # 70b on 131,072 GPUs: each GPU holds one padded row of every tensor. zero3's all-gather buffer is one
    # block's 131,072 rows of 57,352 elements in all, 30.07 GB, where 805,412,864 parameters take 3.22 GB.
    status, text = page(client, {"size": "70b", "gpus": "131072", "gpu_memory_gb": "80", "micro_batch": "1"})
    assert status == 200
    assert cell_bytes(text, "analytic-zero3-all_gather_buffers") == 4 * 131_072 * 57_352
    note = html.unescape(re.search(r'id="padding-zero3">(.*?)</p>', text, re.S).group(1))
    assert "all gather buffers 26.85 GB of 30.07 GB" in note  # 30,068,965,376 - 3,221,651,456 B
    assert "PyTorch's implementation, not the ZeRO paper's" in note
    assert "with more GPUs than a tensor's rows, each GPU holds one padded row" in note
    assert 'id="padding-zero2"' in text and 'id="padding-ddp"' not in text
    status, text = page(client, {"size": "70b", "gpus": "1024", "gpu_memory_gb": "80", "micro_batch": "1"})
    assert status == 200 and 'class="padding-note"' not in text  # 0.06% of the peak there


def test_huge_answers_are_written_in_pb_and_eb_never_tb_with_nine_digits(client):
    from studyapp.views.plan import decimal_bytes

    assert [decimal_bytes(v) for v in (1_500_000_000_000_000, 309_559_663_450_000_000_000, 999_996 * 10**15,
                                       4_610_000 * 10**18)] == [
        "1.50 PB", "309.56 EB", "1,000.00 EB", "4,610,000.00 EB"]
    status, text = page(client, {"size": "custom", "layers": "1024", "width": "65536", "heads": "64", "vocab": "50304",
                                 "seq_len": "1024", "gpus": "64", "micro_batch": "1048576"})
    assert status == 200
    verdict = re.sub(r"<[^>]+>", "", re.search(r'id="verdict">(.*?)</p>', text, re.S).group(1))
    assert re.search(r"Peak \d{1,3}\.\d\d EB per GPU", verdict), verdict
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", text)
    assert "▲ 4.61 EB" in labels and not any("e+" in label for label in labels)  # the chart's bars
