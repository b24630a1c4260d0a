"""Measuring labs' configurations (sharding_lab.engine.run_labs): a run that times no steps reports no
step time, and beside the same configuration timed it is measured once, not twice."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from sharding_lab.engine.run_labs import measure_configs
from sharding_lab.measurement import Measurement
from sharding_lab.report import render_measurement
from sharding_lab.run_config import RunConfig

pytestmark = pytest.mark.slow


def test_an_untimed_run_beside_its_timed_twin_is_measured_once_and_a_lone_one_times_nothing():
    zero3_timed = RunConfig.of("zero3", world_size=2, timed_steps=2)
    zero3_untimed = zero3_timed.replace(timed_steps=0)
    ddp_untimed = RunConfig.of("ddp", world_size=2, timed_steps=0)
    heard: list[str] = []

    measured, _ = measure_configs([zero3_untimed, ddp_untimed, zero3_timed], on_progress=heard.append)

    launches = [line for line in heard if line.startswith("launching")]
    assert launches == ["launching 2 ranks: zero3, ddp"], "one launch, and zero3 measured once"
    assert set(measured) == {zero3_timed, zero3_untimed, ddp_untimed}
    assert measured[zero3_untimed] is measured[zero3_timed]
    assert measured[zero3_timed].config.timed_steps == 2 and measured[zero3_timed].step_time_s > 0

    ddp = measured[ddp_untimed]
    assert ddp.config.timed_steps == 0 and ddp.step_time_s is None
    # Everything else was measured: the tracked step's memory and collectives, and a finite loss.
    assert all(rank.peak_bytes > 0 for rank in ddp.ranks) and len(ddp.ranks) == 2
    assert ddp.comm.totals()["all_reduce"].count > 0
    assert math.isfinite(ddp.loss)
    assert Measurement.from_json(ddp.to_json()) == ddp  # None survives the JSON round trip

    out = io.StringIO()
    render_measurement(ddp, Console(file=out, width=200))
    assert "step time not timed (timed_steps=0)" in out.getvalue()
