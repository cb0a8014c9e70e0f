"""`python -m anvil_executor`: run one executor process."""

from anvil_core.runtime import run_sync_service
from anvil_executor.service import Executor
from anvil_executor.settings import ExecutorSettings


def main() -> None:
    settings = ExecutorSettings()
    run_sync_service("executor", settings, Executor(settings).run)


if __name__ == "__main__":
    main()
