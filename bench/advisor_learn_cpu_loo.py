"""Leave one out over the six shapes that bench/advisor_learn_cpu.py measured: each shape in turn
is the sixth, predicted by ``fit`` of the other five (the same pure fit the service runs), so
one run's measurements say how the check depends on which shape comes last.

Reads the measured medians and plans from that bench's text output; rebuilds each job's spec
as the bench submitted it and its plan with the advisor (the label must match the output's).

    python bench/advisor_learn_cpu_loo.py bench/data/advisor_learn_cpu-2026-12-04.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.advisor_learn_cpu import LEARNT, SIXTH, _label, _spec
from service.core.advisor import advise
from service.core.advisor.calibration import Observation, fit
from service.core.advisor.step_time import predict_step_time
from service.core.clusters import LOCAL_PROFILE
from service.core.observing import observation_of
from service.core.spec import JobSpec

ROW = re.compile(r"^(h\d+ .+?ZeRO-\d)\s+(ZeRO-\d.*?mb=\d+x\d+)\s+([\d.]+)ms")


def observations(output: Path) -> list[Observation]:
    measured = {m[1]: (m[2], float(m[3]) / 1e3) for m in map(ROW.match, output.open()) if m}
    found = []
    for shape in [*LEARNT, SIXTH]:
        plan_label, seconds = measured[_label(shape)]
        spec_file = _spec(Path("/tmp"), shape, 30)
        spec = JobSpec.model_validate(yaml.safe_load(spec_file.read_text()))
        spec_file.unlink()
        plan = advise(spec, LOCAL_PROFILE).plan
        assert plan.label() == plan_label, (plan.label(), plan_label)
        found.append(observation_of(_label(shape), spec, plan, LOCAL_PROFILE, seconds))
    return found


def main() -> None:
    runs = observations(Path(sys.argv[1]))
    print(f"{'left out (predicted)':44} {'measured':>9} {'today':>8} {'fit on the other 5':>19}")
    for held in runs:
        others = fit([o for o in runs if o is not held])
        today = predict_step_time(held.work, held.layout).seconds
        calibrated = predict_step_time(held.work, held.layout, others.constants).seconds
        measured = held.step_seconds
        print(f"{held.key:44} {measured * 1e3:7.1f}ms {today / measured - 1:+8.1%}"
              f" {calibrated / measured - 1:+19.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
