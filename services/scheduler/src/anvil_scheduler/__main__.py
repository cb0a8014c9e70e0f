"""`python -m anvil_scheduler`: run one scheduler process."""

from anvil_core.runtime import run_sync_service
from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings


def main() -> None:
    settings = SchedulerSettings()
    run_sync_service("scheduler", settings, Scheduler(settings).run)


if __name__ == "__main__":
    main()
