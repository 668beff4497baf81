"""A client's conversation in PostgreSQL's protocol, as the engine answers it: fed the
client's messages (`cache.wire.protocol`), it writes the answers' bytes; the cache answers what
it holds (`Session.read`, the cache's own statements) and passes the rest to the backend on
the session's link, in the client's message order. Sans I/O with the client: the server moves
the bytes (`cache.server`).

- `conversation`: the messages of the simple and extended protocols, answered one by one;
- `at_once`: a whole run of a prepared statement taken at once by the event loop (lanes,
  cached reads at hand, runs passed through raw by `raw` or through libpq);
- `pipeline`: the backend's side, in libpq's pipeline mode, answers kept in message order;
- `statements`: the statements and portals the client prepared and bound;
- `settings`: what the client was told of its session's settings;
- `reported`, `statistics`: what the server keeps for all its sessions (the backend's
  reported defaults and descriptions; statement counts and latencies).
"""

from cache.engine.conversation.at_once import Answered, AtOnce, Passing, Relay
from cache.engine.conversation.conversation import Conversation
from cache.engine.conversation.raw import RawRun
from cache.engine.conversation.reported import Description
from cache.engine.conversation.statements import Statement

__all__ = [
    "Answered",
    "AtOnce",
    "Conversation",
    "Description",
    "Passing",
    "RawRun",
    "Relay",
    "Statement",
]
