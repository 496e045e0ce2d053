"""One thread pool for a compiled model: its generated kernels' parallel loops run on the OpenMP
pool that PyTorch's oneDNN calls use, instead of TVM's own pool.

With two pools on the same cores, every hand-over between a generated kernel and a library call
costs: the pool that just finished spins on the cores the other needs, or sleeps and must be woken
(a futex wake, an inter-processor interrupt on a VM) before the next kernel starts.  TVM's compiled
code calls its parallel launcher through a function pointer the library holds
(``__TVMBackendParallelLaunch``, filled in when the library loads); we point it at a small
launcher built on OpenMP, so a model's generated and library kernels share one set of threads and
one spin policy (``GOMP_SPINCOUNT``, see ``adaptune/__init__.py``).

The launcher is compiled once with the C compiler TVM's ``export_library`` uses, linked against the
libgomp PyTorch has loaded (same soname: one runtime, one pool), and cached.  Where no compiler is
found, models keep TVM's pool and one warning line says so.  A library whose kernels use TVM's
parallel barrier keeps TVM's pool (OpenMP's barrier semantics differ when tasks outnumber threads).

The launcher also balances the cores.  TVM's own pool gives each thread one contiguous share of a
parallel loop, so a kernel waits for its slowest core, and a VM's cores are often unequal (another
tenant on one).  Here the loop is cut into ``CHUNKS_PER_THREAD`` chunks per thread; each thread
runs its own contiguous run of chunks from the front, and a thread that is done takes the chunks
left at the back of the others' runs.  With equal cores every thread gets the share TVM's pool
would give it, so a kernel reads the data the kernel before it left in the same core's cache; a
shared counter handing out chunks in turn measured slower for that reason (docs/decisions.md).

The launcher can also clock its parallel regions (``RegionClock``), so that a profile times each
kernel as the model runs it with no Python between the calls (``timing.profile``).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import tempfile
from pathlib import Path

LAUNCH, BARRIER = "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"

#: chunks of a parallel loop per thread: enough for a fast core to take over a slow one's tail
CHUNKS_PER_THREAD = 16

# TVM's FTVMParallelLambda contract (c_backend_api.h): task ``i`` of ``num_task`` gets its share of
# the loop (``ceil(extent / num_task)`` iterations); num_task 0 means "as many as the pool has
# threads", and then the launcher chooses the count.  Each thread's run of chunks is [lo, hi) packed
# in one 64-bit word, on its own cache line: the owner takes lo, a thief takes hi - 1, by CAS.
SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
typedef struct { uint64_t run; char pad[56]; } Run;
enum { MAX_THREADS = 256, CHUNKS_PER_THREAD = @CHUNKS@, CLOCK_SLOTS = 1 << 16 };

/* The region clock: while on, each launch's wall time (microseconds) is kept, in launch order. */
static int clock_on;
static int64_t regions;
static double region_us[CLOCK_SLOTS];
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
void adaptune_clock(int on) { clock_on = on; regions = 0; }
int64_t adaptune_regions(void) { return regions; }
double adaptune_region_us(int64_t i) { return i >= 0 && i < regions && i < CLOCK_SLOTS ? region_us[i] : -1.0; }

static int take(Run* r, int from_back) {
  uint64_t old = __atomic_load_n(&r->run, __ATOMIC_RELAXED);
  for (;;) {
    uint32_t lo = (uint32_t)old, hi = (uint32_t)(old >> 32);
    if (lo >= hi) return -1;
    uint64_t next = from_back ? (lo | (uint64_t)(hi - 1) << 32) : ((lo + 1) | (uint64_t)hi << 32);
    if (__atomic_compare_exchange_n(&r->run, &old, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      return from_back ? (int)(hi - 1) : (int)lo;
  }
}

int adaptune_parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  double start = clock_on ? now_us() : 0.0;
  int threads = num_task > 0 ? num_task : omp_get_max_threads();
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  int chunks = num_task > 0 ? num_task : threads * CHUNKS_PER_THREAD;
  int err = 0;
  TVMParallelGroupEnv env = {NULL, chunks};
  Run runs[MAX_THREADS];
  for (int t = 0; t < threads; t++)
    runs[t].run = (uint64_t)(t * chunks / threads) | (uint64_t)((t + 1) * chunks / threads) << 32;
  #pragma omp parallel num_threads(threads)
  {
    int me = omp_get_thread_num();
    for (int k = 0; k < threads; k++) {            /* own run first, then the others' tails */
      int i;
      while ((i = take(&runs[(me + k) % threads], k > 0)) >= 0)
        if (flambda(i, &env, cdata) != 0) {
          #pragma omp atomic write
          err = -1;
        }
    }
  }
  if (clock_on) {
    if (regions < CLOCK_SLOTS) region_us[regions] = now_us() - start;
    regions++;
  }
  return err;
}
""".replace("@CHUNKS@", str(CHUNKS_PER_THREAD))

_launcher = None                 # the loaded launcher (ctypes), False once building it failed


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adaptune"


def launcher():
    """The OpenMP launcher's address (an int), building it on first use; None where it cannot be built."""
    global _launcher
    if _launcher is None:
        import torch  # noqa: F401  (loads PyTorch's libgomp first, so the launcher binds to that runtime)
        digest = hashlib.sha256((SOURCE + sys.platform).encode()).hexdigest()[:12]
        path = _cache_dir() / f"omp_launch-{digest}.so"
        try:
            if not path.is_file():
                _build(path)
            _launcher = ctypes.CDLL(str(path))
        except Exception as e:  # noqa: BLE001 - no compiler or no libgomp: keep TVM's pool
            print(f"adaptune: warning: cannot build the OpenMP launcher ({' '.join(str(e).split())[:160]}); "
                  "compiled models use TVM's thread pool", file=sys.stderr)
            _launcher = False
    if not _launcher:
        return None
    return ctypes.cast(_launcher.adaptune_parallel_launch, ctypes.c_void_p).value


class RegionClock:
    """The launcher's clock of its parallel regions: ``start()`` empties it and starts it, ``count()``
    is the regions launched since, ``seconds(lo, hi)`` the wall time of regions ``lo..hi-1``."""

    def __init__(self, lib):
        self._lib = lib
        lib.adaptune_regions.restype = ctypes.c_int64
        lib.adaptune_region_us.restype = ctypes.c_double
        lib.adaptune_region_us.argtypes = [ctypes.c_int64]

    def start(self) -> None:
        self._lib.adaptune_clock(1)

    def stop(self) -> None:
        self._lib.adaptune_clock(0)

    def count(self) -> int:
        return int(self._lib.adaptune_regions())

    def seconds(self, lo: int, hi: int) -> float:
        return sum(max(self._lib.adaptune_region_us(i), 0.0) for i in range(lo, hi)) * 1e-6


def region_clock() -> RegionClock | None:
    """The launcher's ``RegionClock``; None where there is no launcher."""
    return RegionClock(_launcher) if launcher() is not None else None


def _build(path: Path) -> None:
    """Compile ``SOURCE`` into ``path`` atomically (a concurrent process may build it too)."""
    from tvm.support import cc
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as d:
        src = Path(d) / "launch.c"
        src.write_text(SOURCE)
        out = Path(d) / path.name
        cc.create_shared(str(out), [str(src)], options=["-O2", "-fopenmp"], cc=os.environ.get("CC", "gcc"))
        os.replace(out, path)


def share_pool(library_path) -> bool:
    """Point the loaded library at ``library_path``'s parallel launches at the OpenMP launcher.
    Call it after TVM has loaded the library (TVM fills the pointer at load time).  Returns whether
    the library now runs on the OpenMP pool."""
    lib = ctypes.CDLL(str(library_path))            # the handle TVM's dlopen got: same path, same mapping
    try:
        slot = ctypes.c_void_p.in_dll(lib, LAUNCH)
    except ValueError:
        return False                                # no parallel loop at all
    try:
        ctypes.c_void_p.in_dll(lib, BARRIER)
        return False
    except ValueError:
        pass
    address = launcher()
    if address is None:
        return False
    slot.value = address
    return True


def load(path):
    """An exported model loaded with TVM, its parallel launches pointed at the OpenMP launcher where
    possible: (module, whether it runs on the OpenMP pool)."""
    import tvm
    from .library import calls  # noqa: F401  (registers the PyTorch kernels a compiled model may call)
    module = tvm.runtime.load_module(str(path))
    return module, share_pool(path)


def load_shared(executable):
    """``executable`` (a CPU Relax VM executable) exported, loaded and running on the OpenMP pool;
    the executable itself where that is not possible.  Cached on the executable: one export each."""
    module = getattr(executable, "_adaptune_shared_pool", None)
    if module is not None:
        return module
    module = executable
    if launcher() is not None:
        with tempfile.TemporaryDirectory() as d:     # removing the file leaves the loaded mapping
            path = Path(d) / "model.so"
            executable.export_library(str(path))
            loaded, shared = load(path)
            if shared:
                module = loaded
    try:
        executable._adaptune_shared_pool = module
    except AttributeError:
        pass
    return module
