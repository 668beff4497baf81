"""The compliance suite's pytest session: SQLAlchemy's testing plugin, the dialect registered
(as its entry point does once installed), PostgreSQL's provisioning routines."""

import sys
from pathlib import Path

import pytest
from sqlalchemy.dialects import registry

sys.path.insert(0, str(Path(__file__).parent))  # requirements.py
registry.register("postgresql.mtcache", "cache.sqla.dialect", "MTCacheDialect")
pytest.register_assert_rewrite("sqlalchemy.testing.assertions")

import sqlalchemy.dialects.postgresql.provision  # noqa: E402, F401
from sqlalchemy.testing.plugin.pytestplugin import *  # noqa: E402, F403
