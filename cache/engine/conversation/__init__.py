"""A client's conversation in PostgreSQL's protocol, as the engine answers it: fed the
client's messages (`cache.wire.protocol`), it writes the answers' bytes; the cache answers what
it holds (`Session.read`, the cache's own statements) and passes the rest to the backend on
the session's link, in the client's message order (`conversation`). Sans I/O: the server
moves the bytes (`cache.server`)."""

from cache.engine.conversation.conversation import (
    Conversation,
    Description,
    Passing,
    RawRun,
    Statement,
)

__all__ = ["Conversation", "Description", "Passing", "RawRun", "Statement"]
