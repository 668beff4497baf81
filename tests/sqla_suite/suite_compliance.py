"""SQLAlchemy's dialect compliance suite, as a third-party dialect runs it."""

from sqlalchemy.testing.suite import *  # noqa: F403
