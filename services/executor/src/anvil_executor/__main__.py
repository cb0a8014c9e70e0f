"""`python -m anvil_executor`: run one executor process."""

import os
import sys
from collections.abc import MutableMapping

from anvil_core import tracing
from anvil_core.logs import setup_logging
from anvil_core.runtime import run_sync_service, settle_gc
from anvil_executor.service import Executor
from anvil_executor.settings import ExecutorSettings


def thread_pool_env(settings: ExecutorSettings, environ: MutableMapping[str, str]) -> None:
    """OpenMP's idle-wait settings for numba's workers, unless the environment has its own; before any
    parallel region runs (the OpenMP runtime reads them once, when numba first loads it)."""
    environ.setdefault("GOMP_SPINCOUNT", str(settings.omp_spin_count))
    environ.setdefault("KMP_BLOCKTIME", "0")


def gil_switch(settings: ExecutorSettings) -> None:
    """How long a thread may hold the GIL while another waits for it (`gil_switch_us`; 0 keeps
    Python's 5 ms)."""
    if settings.gil_switch_us > 0:
        sys.setswitchinterval(settings.gil_switch_us / 1e6)


def main() -> None:
    settings = ExecutorSettings()
    thread_pool_env(settings, os.environ)
    gil_switch(settings)
    # before the models load: their compile progress, warm-up times and "not served" reasons are
    # logged while Executor() runs (run_sync_service sets the same logging up again, idempotently)
    setup_logging("executor", settings.log_level)
    tracing.setup("executor")  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        service = Executor(settings)
        settle_gc(settings)  # what start-up built lives as long as the process
        run_sync_service("executor", settings, service.run)
    finally:
        tracing.shutdown()  # flush the queued spans


if __name__ == "__main__":
    main()
