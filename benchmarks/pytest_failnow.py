"""pytest plugin for GPU runs (benchmarks/gpu_session.sh: `-p pytest_failnow`): writes each failure, node id and
traceback, to $OUT/failures.txt the moment it happens, so a run that a time limit cuts still names its failures
(pytest's own summary comes only at the end). Under pytest-xdist only the controller writes."""
import os

_config = None


def pytest_configure(config):
    global _config
    _config = config


def pytest_runtest_logreport(report):
    if report.failed and not hasattr(_config, "workerinput"):
        with open(os.path.join(os.environ.get("OUT", "."), "failures.txt"), "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n\n")
