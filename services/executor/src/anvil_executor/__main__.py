"""`python -m anvil_executor`: run one executor process."""

from anvil_core.runtime import run_service

from anvil_executor.service import Executor
from anvil_executor.settings import ExecutorSettings


def main() -> None:
    settings = ExecutorSettings()
    run_service("executor", settings, lambda stop: Executor(settings).run(stop))


if __name__ == "__main__":
    main()
