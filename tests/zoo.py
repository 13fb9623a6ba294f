"""Whether this tree ships the model zoo (models/), for the tests that decode on it."""

import os

import pytest

from services.common.config import DEFAULT_CONFIG, EngineConfig

SHIPPED = all(os.path.isdir(path) for path in EngineConfig.from_yaml(DEFAULT_CONFIG).models.values())
NOT_SHIPPED = "the model zoo is not shipped in this tree"
needs_zoo = pytest.mark.skipif(not SHIPPED, reason=NOT_SHIPPED)
