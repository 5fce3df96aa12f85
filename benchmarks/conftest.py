"""Options, the grid and the shared state of the peer suite (``make bench-ops``; docs/benchmarks.md).

Options (after ``pytest benchmarks``; ``make bench-ops ARGS="..."`` passes them through):

    --quick              a short grid: on cpu N in {2^10, 2^12}; on cuda N in {2^10, 2^12, 2^14, 2^16}
                         and d = 64 (also with the environment variable BENCH_QUICK=1)
    --bench-N LIST       comma-separated N (default 1024,4096,16384,65536)
    --bench-d LIST       widths d of q, k, v (default 16,64; quick on cuda 64)
    --bench-m LIST       FAVOR+ feature counts m (default: m = d); the other ops always have m = d
    --bench-B LIST       batch sizes (default 1)      --bench-H LIST   heads (default 4)
    --bench-dtype LIST   float32, bfloat16, float16 (default float32 on cpu, float32,bfloat16 on
                         cuda); each op runs in those of its ops.DTYPES
    --ops LIST           operations (default: all of ops.OPS)
    --device DEV         cpu (default) or cuda (timed calls then synchronise before returning)
    --threads T          torch.set_num_threads(T) (default 2), recorded in the JSON
    --bench-seed S       seed of the inputs (default 0)
    --steady-allocator   glibc's trim threshold 2^30 and mmap threshold 32 MiB for the whole run
                         (benchmarks.blocks.steady_allocator): freed tensors are not given back
                         and faulted in again between calls; recorded in the JSON as "allocator"

float32 means float32 accuracy for every library: torch's matmuls are IEEE by default
(torch.backends.cuda.matmul.allow_tf32 is False), and Triton's dots of float32 tensors, which
default to one TF32 product on NVIDIA GPUs (10-bit mantissas: fla-core would compute another
function, which the check refuses), take three ("tf32x3", as maskbench's own kernel does): the
suite sets TRITON_F32_DEFAULT=tf32x3 unless it is set already.

The JSON written by ``--benchmark-json`` gets a "maskbench" block (threads, device, dtypes, the
allocator setting, torch, triton and peer versions, the skip messages) for benchmarks/summary.py.
"""
from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field

import pytest
import torch

from benchmarks import ops

DEFAULT_N = (2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16)
QUICK_N = {"cpu": (2 ** 10, 2 ** 12), "cuda": (2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16)}
DEFAULT_D = (16, 64)
QUICK_D = {"cpu": DEFAULT_D, "cuda": (64,)}
DEFAULT_DTYPES = {"cpu": ("float32",), "cuda": ("float32", "bfloat16")}


def _ints(name: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise pytest.UsageError(f"{name} must be comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise pytest.UsageError(f"{name} must be comma-separated positive integers, got {text!r}")
    return values


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("maskbench peers", "maskbench peer benchmarks (benchmarks/conftest.py)")
    group.addoption("--quick", action="store_true", default=False,
                    help="a short grid: N in {2^10, 2^12} on cpu, {2^10, ..., 2^16} and d = 64 on cuda "
                         "(also BENCH_QUICK=1)")
    group.addoption("--bench-N", dest="bench_N", default=None, help="comma-separated N")
    group.addoption("--bench-d", dest="bench_d", default=None, help="comma-separated d (default 16,64)")
    group.addoption("--bench-m", dest="bench_m", default=None,
                    help="comma-separated FAVOR+ m (default m = d; the other ops always m = d)")
    group.addoption("--bench-B", dest="bench_B", default="1", help="comma-separated batch sizes (default 1)")
    group.addoption("--bench-H", dest="bench_H", default="4", help="comma-separated head counts (default 4)")
    group.addoption("--bench-dtype", dest="bench_dtype", default=None,
                    help="comma-separated dtypes among float32,bfloat16,float16 (default float32 on cpu, "
                         "float32,bfloat16 on cuda)")
    group.addoption("--ops", dest="bench_ops", default=",".join(ops.OPS), help="comma-separated operations")
    group.addoption("--device", dest="bench_device", default="cpu", help="cpu (default) or cuda")
    group.addoption("--threads", dest="bench_threads", type=int, default=2, help="torch threads (default 2)")
    group.addoption("--bench-seed", dest="bench_seed", type=int, default=0, help="seed of the inputs")
    group.addoption("--steady-allocator", dest="bench_steady_allocator", action="store_true", default=False,
                    help="hold glibc's heap for every library (benchmarks.blocks.steady_allocator)")


@dataclass(frozen=True)
class Case:
    """One benchmark: one library's call of one operation, one pass, one size, one dtype."""

    op: str
    pass_: str
    library: str
    size: ops.Size
    dtype: str = "float32"

    @property
    def group(self) -> str:
        s = self.size
        widths = f"d=m={s.d}" if s.d == s.m else f"d={s.d} m={s.m}"
        return f"{self.op} {self.pass_} B={s.B} H={s.H} N={s.N} {widths} {self.dtype}"

    @property
    def id(self) -> str:
        s = self.size
        short = "fwd" if self.pass_ == "forward" else "fwdbwd"
        return f"{self.op}-{short}-B{s.B}-H{s.H}-N{s.N}-d{s.d}-m{s.m}-{self.dtype}-{self.library}"


@dataclass
class PeerState:
    """What the session shares: the device, the skip messages, the equivalence checks (one per
    op, pass, size and dtype, run before the first of its two benchmarks), the latest problem."""

    device: str
    seed: int
    quick: bool
    dtypes: tuple = ("float32",)
    allocator: str = "default"
    skipped: set = field(default_factory=set)
    checks: dict = field(default_factory=dict)
    cases: dict = field(default_factory=dict)
    _unavailable: dict = field(default_factory=dict)
    _problem: tuple | None = None

    def unavailable(self, op: str, dtype: str = "float32", d: int = 16) -> str | None:
        key = (op, dtype, d)
        if key not in self._unavailable:
            self._unavailable[key] = ops.op_unavailable(op, self.device, ops.DTYPE_OF_NAME[dtype], d)
        return self._unavailable[key]

    def problem(self, size: ops.Size, dtype: str = "float32") -> ops.Problem:
        if self._problem is None or self._problem[0] != (size, dtype):
            self._problem = None  # free the previous inputs first
            self._problem = ((size, dtype), ops.make_problem(size, self.device, seed=self.seed,
                                                             dtype=ops.DTYPE_OF_NAME[dtype]))
        return self._problem[1]

    def equivalence(self, op: str, pass_: str, size: ops.Size, dtype: str = "float32") -> ops.Equivalence:
        key = (op, pass_, size, dtype)
        if key not in self.checks:
            self.checks[key] = ops.compare(op, pass_, self.problem(size, dtype))
        return self.checks[key]


_STATE = pytest.StashKey[PeerState]()


def _quick(config: pytest.Config) -> bool:
    return bool(config.getoption("quick")) or os.environ.get("BENCH_QUICK", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    device = config.getoption("bench_device")
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise pytest.UsageError(f"--device must be cpu or cuda, got {device!r}") from None
    if kind not in ("cpu", "cuda"):
        raise pytest.UsageError(f"--device must be cpu or cuda, got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    threads = config.getoption("bench_threads")
    if threads < 1:
        raise pytest.UsageError(f"--threads must be a positive integer, got {threads}")
    torch.set_num_threads(threads)
    allocator = "default"
    if config.getoption("bench_steady_allocator"):
        from benchmarks.blocks import steady_allocator
        try:
            allocator = steady_allocator()
        except RuntimeError as err:
            raise pytest.UsageError(str(err)) from None
    # float32 accuracy for Triton's kernels too, as maskbench's kernel computes (module doc); read
    # when a kernel compiles
    os.environ.setdefault("TRITON_F32_DEFAULT", "tf32x3")
    config.stash[_STATE] = PeerState(device=device, seed=config.getoption("bench_seed"), quick=_quick(config),
                                     dtypes=_dtypes(config, kind), allocator=allocator)


def _dtypes(config: pytest.Config, kind: str) -> tuple[str, ...]:
    text = config.getoption("bench_dtype")
    if text is None:
        return DEFAULT_DTYPES[kind]
    names = tuple(dict.fromkeys(part.strip() for part in str(text).split(",") if part.strip()))
    bad = [name for name in names if name not in ops.DTYPE_OF_NAME]
    if bad or not names:
        raise pytest.UsageError(f"--bench-dtype must be a comma-separated subset of {','.join(ops.DTYPE_OF_NAME)}, "
                                f"got {text!r}")
    return names


def cases(config: pytest.Config) -> list[Case]:
    """The grid, in run order: per operation, dtype, pass, (B, H), N and (d, m), maskbench then its peer.

    An operation runs in the asked dtypes that it has (ops.DTYPES) and up to its ops.max_n."""
    wanted = tuple(part.strip() for part in config.getoption("bench_ops").split(",") if part.strip())
    unknown = [op for op in wanted if op not in ops.OPS]
    if unknown or not wanted:
        raise pytest.UsageError(f"--ops must be a comma-separated subset of {','.join(ops.OPS)}, got "
                                f"{config.getoption('bench_ops')!r}")
    try:
        kind = torch.device(config.getoption("bench_device")).type
    except (RuntimeError, TypeError):
        kind = "cpu"  # pytest_configure has refused it already
    kind = kind if kind in QUICK_N else "cpu"
    quick = _quick(config)
    ns = _ints("--bench-N", config.getoption("bench_N")) or (QUICK_N[kind] if quick else DEFAULT_N)
    ds = _ints("--bench-d", config.getoption("bench_d")) or (QUICK_D[kind] if quick else DEFAULT_D)
    ms = _ints("--bench-m", config.getoption("bench_m"))
    bs = _ints("--bench-B", config.getoption("bench_B"))
    hs = _ints("--bench-H", config.getoption("bench_H"))
    dtypes = _dtypes(config, kind)
    out = []
    for op in wanted:
        favor = op.startswith("favor")
        widths = [(d, m) for d in ds for m in (ms if favor and ms else (d,))]
        largest = ops.max_n(op, kind)
        for dtype in (dt for dt in dtypes if dt in ops.DTYPES[op]):
            for pass_ in ops.PASSES:
                for b in bs:
                    for h in hs:
                        for n in ns:
                            if largest is not None and n > largest:
                                continue
                            for d, m in widths:
                                size = ops.Size(b, h, n, d, m)
                                out += [Case(op, pass_, lib, size, dtype) for lib in (ops.MASKBENCH, ops.PEER_OF[op])]
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # parametrised by id strings (they serialise into the JSON's "params"); the case fixture maps back
    if "bench_id" in metafunc.fixturenames:
        grid = cases(metafunc.config)
        metafunc.config.stash[_STATE].cases.update({c.id: c for c in grid})
        metafunc.parametrize("bench_id", [c.id for c in grid], ids=[c.id for c in grid])


@pytest.fixture(scope="session")
def peer_state(request: pytest.FixtureRequest) -> PeerState:
    return request.config.stash[_STATE]


@pytest.fixture
def case(bench_id: str, peer_state: PeerState) -> Case:
    return peer_state.cases[bench_id]


def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    device = torch.device(state.device)
    output_json["maskbench"] = {
        "torch": torch.__version__,
        "triton": _version("triton"),
        # Triton's float32 dot precision (module doc); None: Triton's default (TF32 on NVIDIA)
        "triton_f32_default": os.environ.get("TRITON_F32_DEFAULT"),
        "threads": torch.get_num_threads(),
        "device": device.type,
        # the CPU's name is pytest-benchmark's machine_info["cpu"]["brand_raw"]
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        # every benchmark's own dtype is in its extra_info; this is the run's list
        "dtype": ",".join(state.dtypes),
        "quick": state.quick,
        "seed": state.seed,
        # "default", or glibc's mallopt setting of --steady-allocator (benchmarks.blocks)
        "allocator": state.allocator,
        # a version only where the library could run here (else it was skipped: "skipped" says why)
        "peers": {lib: ops.peer_version(lib) if ops.library_unavailable(lib, device) is None else None
                  for lib in (ops.PERFORMER, ops.FAST_TRANSFORMERS, ops.FLA)},
        "skipped": sorted(state.skipped),
    }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
