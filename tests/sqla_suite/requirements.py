"""What ``postgresql+mtcache`` supports, for SQLAlchemy's compliance suite. The suite's own
defaults (`SuiteRequirements`) assume little; PostgreSQL, which the dialect is, has these
too. A requirement left closed skips its tests; each one this file closes says why."""

from sqlalchemy.testing import exclusions
from sqlalchemy.testing.requirements import SuiteRequirements


class Requirements(SuiteRequirements):
    @property
    def views(self):
        return exclusions.open()

    @property
    def materialized_views(self):
        return exclusions.open()

    @property
    def temp_table_names(self):
        return exclusions.open()

    @property
    def reflect_table_options(self):
        return exclusions.open()

    @property
    def reflects_pk_names(self):
        return exclusions.open()

    @property
    def unique_constraints_reflect_as_index(self):
        return exclusions.open()

    @property
    def supports_distinct_on(self):
        return exclusions.open()
