"""`python -m anvil_scheduler`: run one scheduler process."""

from anvil_core import tracing
from anvil_core.runtime import run_sync_service, settle_gc
from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings


def main() -> None:
    settings = SchedulerSettings()
    tracing.setup("scheduler")  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        service = Scheduler(settings)
        settle_gc(settings)  # what start-up built lives as long as the process
        run_sync_service("scheduler", settings, service.run)
    finally:
        tracing.shutdown()  # flush the queued spans


if __name__ == "__main__":
    main()
