"""The orchestrator replica's own log lines go where Serve writes the replica's log: Serve's `logging_config` sets up
only the `ray.serve` logger (the replica's file under Ray's session logs, its level, its encoding), so the engine's
`dlm.requests` line per finished request and this package's warnings would reach no file without this."""

import logging

SERVE_LOGGER = "ray.serve"
OURS = ("dlm", "services")  # dlm.requests (services/orchestrator/engine/telemetry.py) and the module loggers


class ToServeLog(logging.Handler):
    """Hands each record to Serve's replica logger, then flushes it: Serve's throughput-optimized mode buffers 1000
    records before writing, and a finished request's line belongs in the log when the request ends."""

    def emit(self, record: logging.LogRecord) -> None:
        serve_log = logging.getLogger(SERVE_LOGGER)
        serve_log.handle(record)
        for handler in serve_log.handlers:
            handler.flush()


def to_serve_log(level: str) -> None:
    """Route our loggers, at level (serving.log_level), into the replica's Serve log, and only there."""
    for name in OURS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers = [ToServeLog()]
        logger.propagate = False
