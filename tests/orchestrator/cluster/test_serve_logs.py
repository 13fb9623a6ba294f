"""The orchestrator's loggers write into the replica's Serve log, at once although Serve buffers; the served check is
tests/test_readme_served.py."""

import logging
import logging.handlers

import pytest

from services.orchestrator.cluster.serve_logs import OURS, SERVE_LOGGER, to_serve_log


@pytest.fixture
def serve_log(tmp_path):
    """Serve's replica logger as its logging_config leaves it in throughput-optimized mode: a 1000-record buffer in
    front of the file, no propagation."""
    path = tmp_path / "replica_dlm_orchestrator_x.log"
    target = logging.FileHandler(path)
    target.setFormatter(logging.Formatter("%(levelname)s -- %(message)s"))
    serve = logging.getLogger(SERVE_LOGGER)
    loggers = [logging.getLogger(name) for name in (SERVE_LOGGER, *OURS)]
    saved = [(lg, lg.level, lg.handlers, lg.propagate) for lg in loggers]
    serve.handlers, serve.propagate = [logging.handlers.MemoryHandler(1000, target=target)], False
    serve.setLevel("INFO")
    yield path
    for logger, level, handlers, propagate in saved:
        logger.setLevel(level)
        logger.handlers, logger.propagate = handlers, propagate
    target.close()


def test_a_request_line_is_in_the_replica_log_when_logged(serve_log):
    to_serve_log("INFO")
    logging.getLogger("dlm.requests").info('{"request_id": "a"}')
    logging.getLogger("services.orchestrator.api.openai_api").warning("ignored unknown fields ['x']")
    logging.getLogger("dlm.requests").debug("below the level")
    assert serve_log.read_text().splitlines() == [
        'INFO -- {"request_id": "a"}',
        "WARNING -- ignored unknown fields ['x']",
    ]
