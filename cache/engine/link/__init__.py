"""A session's link to the backend (`connection`): its backend connection and the books of
what reaches it (`effects`), and PostgreSQL's answers relayed as it sent them (`relay`)."""

from cache.engine.link.connection import BackendLink

__all__ = ["BackendLink"]
