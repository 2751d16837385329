"""Time from replay: a step-cost profile measured on the real engine, and its validation.

`calibrate` runs calibration workloads through the real vLLM engine (every step's make-up and
wall time recorded), fits a small, named, linear model of a step's cost (`fit`), and checks
it on held-out workloads: replay on that clock against the same real engine, request by
request. `replay` then predicts TTFT, TPOT and throughput from vLLM's own scheduling
decisions (`RunConfig.clock`).
"""

from __future__ import annotations

from analysis.timing.calibration import Calibration, calibrate, validate_profile, write
from analysis.timing.fit import fit_profile

__all__ = ["Calibration", "calibrate", "fit_profile", "validate_profile", "write"]
