"""Time from replay: a step-cost profile measured on the real engine, and its validation.

`calibrate` runs calibration workloads through the real vLLM engine (every step's make-up and
wall time recorded), fits a small, named, linear model of a step's cost (`fit`), and checks
it on held-out workloads: replay on that clock against the same real engine, request by
request. `replay` then predicts TTFT, TPOT and throughput from vLLM's own scheduling
decisions (`RunConfig.clock`). `served` sets that prediction against the real HTTP server:
the engine calibrated as the server runs it, two named server terms, held-out cells.
"""

from __future__ import annotations

from analysis.timing.calibration import Calibration, calibrate, validate_profile, write
from analysis.timing.fit import fit_profile

__all__ = ["Calibration", "calibrate", "fit_profile", "validate_profile", "write"]
