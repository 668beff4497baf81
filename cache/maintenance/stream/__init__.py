"""Continuous maintenance from the WAL (the design in
docs/decisions/continuous-maintenance-from-the-wal.md): views declared ``REFRESH
CONTINUOUSLY`` are kept current from PostgreSQL's logical replication stream.

`publication_for` (around the cache DDL) keeps one publication and one slot per cache file
over the continuously maintained views' tables and the heartbeat table. `Consumer` streams the slot
(`cache.backend.replication.SlotStream`), and `apply_transactions` applies whole backend
transactions, in commit order, to the views in one DuckDB transaction with the stream
position: a crash anywhere streams again from the position the file stores (nothing lost,
nothing applied twice).

Applying is set-based (one batch of transactions = a few statements per view): per table, the
last change of each key wins; the keys touched are deleted from the view and the final rows
inserted where they belong to a present region (Noria's partial state: changes to keys the
cache does not hold are dropped; a row moving into a present region arrives whole, one moving
out leaves). Views go parents first, so a child row belongs where its parent row now is; a
parent key that disappears takes its children's rows with it. What the stream cannot carry -
the children of a parent row that newly appears, the rest of a presence region a completeness
region admits - is pulled (an upquery: `Maintainer` in the backend's current snapshot, lined
up with the stream by `cache.maintenance.lineup`).

The heartbeat's row travels in the same stream: applying heartbeat time T means every change
committed before T is applied, so the continuously maintained regions are stamped T, all
with the one snapshot id of the batch, which names the stream position (``lsn X/Y``).

The modules: `position` (the stream's row and what the others share), `publication` (the
cache DDL's side), `transactions`, `staging` and `views` (applying), `consumer` (the thread of
the owning process), `status`.
"""

from cache.maintenance.stream.consumer import Consumer
from cache.maintenance.stream.position import (
    DEFAULT_LAG_LIMIT,
    StreamProblem,
    StreamRow,
    load_stream,
)
from cache.maintenance.stream.publication import apply_ddl, publication_for
from cache.maintenance.stream.status import stream_status

__all__ = [
    "DEFAULT_LAG_LIMIT",
    "Consumer",
    "StreamProblem",
    "StreamRow",
    "apply_ddl",
    "load_stream",
    "publication_for",
    "stream_status",
]
