"""`autotuner init`: a scenario and a daemon config from what the user already runs."""

from autotuner.init.onboard import DAEMON_FILE, SCENARIO_FILE, InitResult, run_init

__all__ = ["DAEMON_FILE", "SCENARIO_FILE", "InitResult", "run_init"]
