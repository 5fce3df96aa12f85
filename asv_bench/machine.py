"""The machine's fp32 matmul rate: the roofline ceiling for the attention timings.

    machine.MatmulPeak.track_matmul_gflops   params: threads ("1", "all"); unit GFLOP/s

A 2048 x 2048 float32 torch matmul (2 n^3 flops) is timed in-process: one warm-up, then five
measurements of >= 0.2 s each (measure.timing.measure), and the best is reported (to 4
significant digits, common.significant, as every track_ value), since noise
only ever lowers the rate and the peak is what a kernel's rate is compared with (docs/methods.md,
"Roofline"). "1" matches the single thread of the attention benchmarks; "all" is torch's
default thread count on this machine (both cores here), reported separately as docs/methods.md
asks. Tracked across commits it also tells a slower machine or torch from a slower commit.
"""
from __future__ import annotations

import torch

try:  # measure/ from issue 22 on; older commits (asv runs them) keep timing in verify/
    from measure.timing import measure
except ImportError:
    from verify.timing import measure

from . import common

#: torch's default intra-op thread count, read before any benchmark pins it.
DEFAULT_THREADS = torch.get_num_threads()


class MatmulPeak:
    """fp32 matmul GFLOP/s on one thread and on torch's default thread count."""

    params = [["1", "all"]]
    param_names = ["threads"]
    unit = "GFLOP/s"
    timeout = 120.0
    size = 2048
    measurements = 5
    min_time = 0.2

    def setup(self, threads):
        torch.set_num_threads(1 if threads == "1" else DEFAULT_THREADS)
        gen = torch.Generator().manual_seed(common.SEED)
        n = self.size
        self.a = torch.randn(n, n, generator=gen, dtype=torch.float32)
        self.b = torch.randn(n, n, generator=gen, dtype=torch.float32)
        self.out = torch.empty(n, n, dtype=torch.float32)

    def track_matmul_gflops(self, threads):
        def matmul():
            torch.mm(self.a, self.b, out=self.out)

        matmul()  # warm-up: first-call allocation and MKL initialisation
        seconds = min(measure(matmul, min_time=self.min_time) for _ in range(self.measurements))
        return common.significant(2.0 * self.size**3 / seconds / 1e9)
