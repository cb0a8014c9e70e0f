"""`python -m anvil_qos`: run the qos process."""

from anvil_core.runtime import run_service
from anvil_qos.service import Qos
from anvil_qos.settings import QosSettings


def main() -> None:
    settings = QosSettings()
    run_service("qos", settings, lambda stop: Qos(settings).run(stop))


if __name__ == "__main__":
    main()
