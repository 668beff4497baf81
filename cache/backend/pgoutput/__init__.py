"""PostgreSQL's logical replication messages (pgoutput, protocol versions 1 and 2), decoded:
what the stream consumer of continuously maintained views reads (the design in
docs/decisions/continuous-maintenance-from-the-wal.md).

The messages come one by one from a streaming session (cache/backend/replication.SlotStream)
or, one per row, from ``pg_logical_slot_peek_binary_changes(slot, .., 'proto_version', '1',
'publication_names', pub)``. `decode` turns one into a typed message; `Transactions` groups a
stream of them into whole backend transactions in commit order. A transaction keeps its row
changes (Insert, Update, Delete: one message per row) as they were sent, with the relation
descriptions in effect for them (pgoutput sends a relation's description before its first
change in a session, and again when it changes); `Transaction.rows` decodes them at once, with
numpy over their bytes, into Arrow text columns per relation (`RowChanges`). Column values stay
PostgreSQL's text form (NULL apart, and a TOASTed value the update did not touch flagged
``unchanged``); the consumer types them as the view's columns.

Big transactions. With protocol version 2 and ``streaming 'on'``, the backend sends a
transaction larger than its ``logical_decoding_work_mem`` while it is in progress, in blocks
(Stream Start ... Stream Stop, each change carrying its (sub)transaction's xid), and then its
Stream Commit or Stream Abort (of the whole, or of one subtransaction). Whether streamed or
not, a transaction's changes past ``spill_changes`` go to a file of its own in
``spill_dir`` (pickled pieces of ``spill_changes`` changes), so memory holds one piece per
transaction; `Transaction.pieces` reads them back in order at its commit, and an abort drops
them. The files are the session's: the next session starts from the applied position, and
the backend sends the transaction again.

The modules: `messages` (the message types, `decode`, LSNs as text), `rows` (a transaction's
row changes decoded at once: `RowChanges`, `decode_rows`) and `transactions` (`Transaction`,
`Transactions`: grouping, protocol 2's streaming, spilling).
"""
