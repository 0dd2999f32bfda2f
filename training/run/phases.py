"""--profile-steps: how long each phase of a training step takes (forward, backward, the
allreduce's wait, the optimizer step), over the first steps of a run."""
import contextlib
import time

import torch


class PhaseTimer:
    """--profile-steps: wall time of each phase of the first `steps` steps.

    Each phase is bracketed by device synchronisations, so the numbers are
    real but the run is slower while it measures; it is off by default.
    """
    PHASES = ("forward", "backward", "allreduce-wait", "optimizer-step")

    def __init__(self, steps, device=None):
        self.steps, self.device = steps, device
        self.times = {p: [] for p in self.PHASES}
        self.active = False

    def start_step(self, step):
        self.active = step < self.steps
        if self.active:
            for v in self.times.values():
                v.append(0.0)

    @contextlib.contextmanager
    def phase(self, name):
        if not self.active:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.times[name][-1] += time.perf_counter() - t0

    def _sync(self):
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def summary(self):
        def median(v):
            return sorted(v)[len(v) // 2] if v else 0.0
        parts = "  ".join(f"{p} {median(self.times[p]) * 1e3:.2f}" for p in self.PHASES)
        return f"profile: median ms per step over {len(self.times['forward'])} steps: {parts}"
