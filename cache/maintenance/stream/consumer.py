"""The stream consumer of the process that owns a cache file: streams the file's slot and
applies it, batch by batch, riding out backend outages (`Consumer`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import time
import typing as t
from pathlib import Path

import duckdb
import psycopg

from cache.backend.pgoutput.messages import lsn_text
from cache.backend.pgoutput.transactions import SPILL_CHANGES, Transaction, Transactions
from cache.backend.reflect import connect_backend
from cache.backend.replication import (
    SlotStream,
    create_slot,
    slot_state,
    wal_mark,
)
from cache.maintenance import faults
from cache.maintenance.budget import within_budget
from cache.maintenance.lineup import pending_pulls
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.report import Report
from cache.maintenance.stream.arrangements import ARRANGED_BYTES, Arrangements
from cache.maintenance.stream.position import (
    CHECK_SECONDS,
    CONFIRM_SECONDS,
    DEFAULT_LAG_LIMIT,
    IDLE_SECONDS,
    IN_USE_SECONDS,
    Applied,
    NeedsPull,
    StreamProblem,
    StreamRow,
    load_stream,
    log,
)
from cache.maintenance.stream.transactions import apply_transactions, later, run_of
from cache.maintenance.stream.views import stamp_regions
from cache.private_files import make_private_dirs
from cache.store.cache_file import CacheStore
from control_tables.schema import CacheSchema
from heartbeat.loop import Loop
from optimizer.derived.delta import AUX_PREFIX
from sql_ext.catalog import Catalog
from sql_ext.errors import OperationalError, first_line


class Consumer:
    """Streams the file's slot and applies it: `step` once (a batch), `catch_up` until the
    stream has passed the backend's position of now, `start`/`stop` as a thread of the owning
    process. The streaming session stays open between steps (`release` ends it: the cache
    DDL does, before it changes the slot)."""

    def __init__(
        self,
        store: CacheStore,
        dsn: str,
        *,
        batch: int = 20_000,
        poll: float = 0.05,
        lag_limit: int = DEFAULT_LAG_LIMIT,
        spill_changes: int = SPILL_CHANGES,
        arranged_bytes: int = ARRANGED_BYTES,
    ) -> None:
        """``spill_changes``: a transaction's changes held in memory before a piece of them
        goes to disk (`cache.backend.pgoutput.transactions.Transactions`); ``arranged_bytes``:
        the memory the copies' arrangements may take (`arrangements`)."""
        self.store = store
        self.dsn = dsn
        self.batch = batch
        self.poll = poll
        self.lag_limit = lag_limit
        self._conn: psycopg.Connection[t.Any] | None = None
        self._source: SlotStream | None = None
        # a big transaction's pieces go to files here (`Transactions`); what a killed
        # process left is dropped: the next session sends those transactions again
        self._spill = spill_dir(store.path)
        self.spill_changes = spill_changes
        self._decoder = Transactions(spill_dir=self._spill, spill_changes=spill_changes)
        self.spilled = 0  # transactions applied from disk, in pieces
        self._loop = Loop("mtcache-stream")
        self._warned: str | None = None
        self.upqueries = 0
        self.faults = faults.active()
        # the copies' arrangements in memory (`arrangements`): forgotten when a batch fails
        self.arrangements = Arrangements(arranged_bytes)
        self._catalog_at: tuple[int, Catalog] | None = None
        self._confirmed_at = 0.0  # monotonic time the slot was last confirmed
        self._checked_at = 0.0  # monotonic time the slot's lag was last looked at
        # the position the file held after the last step (None: no stream, or stopped)
        self.position: int | None = None
        store.hold_stream(self)

    # -- one batch ---------------------------------------------------------------------------

    def step(self, confirm: bool = True, wait: float = 0.0) -> int:
        """Apply the complete transactions the stream has brought (up to about ``batch``
        messages; with none there yet, waiting up to ``wait`` seconds for some); the number
        applied. ``confirm``: also confirm the slot to the backend when due (at most once a
        second while batches come, and when the stream goes idle)."""
        with self.store.stream_lock:
            stream = load_stream(self.store.con)
            self.position = None
            if stream is None or stream.problem is not None:
                self.release()
                return 0
            try:
                source = self._open(stream)
                if source is None:
                    return 0
                txns: list[Transaction] = []
                taken, started = 0, time.monotonic()
                while True:  # (a transaction in progress: read on, up to a batch, to its end)
                    messages = source.messages(self.batch - taken, wait)
                    taken += len(messages)
                    for txn in self._decoder.read(messages):
                        if txn.end_lsn > stream.applied_lsn:
                            txns.append(txn)
                        else:
                            txn.discard()  # (applied before: the file holds it)
                    if (
                        txns
                        or taken >= self.batch
                        or not self._decoder.in_progress
                        or (not messages and time.monotonic() - started >= wait)
                    ):
                        break
                if not txns:
                    self.position = stream.applied_lsn
                    self._pass_idle(stream, source.reached)
                    if confirm and source.confirmed < stream.applied_lsn:
                        self._confirm(source, stream.applied_lsn, wait=1.0)
                    return 0
                try:
                    self._apply(stream, txns)
                except StreamProblem as exc:
                    self._report(str(exc))
                    self.release()
                    return 0
                self.position = txns[-1].end_lsn  # now in the file
                if confirm and time.monotonic() - self._confirmed_at >= CONFIRM_SECONDS:
                    self._confirm(source, self.position)
                return len(txns)
            except BaseException:
                # what was read goes with the session: the next starts from the file's position
                self.release()
                raise

    def _open(self, stream: StreamRow) -> SlotStream | None:
        """The streaming session, started from the file's position if there is none (None:
        the slot was gone; it is made again and the views pulled anew)."""
        source = self._source
        if source is not None and source.slot == stream.slot:
            if time.monotonic() - self._checked_at >= CHECK_SECONDS:
                self._check_lag(slot_state(self.connection(), stream.slot).lag_bytes)
                self._checked_at = time.monotonic()
            return source
        self.store.release_streams()  # this one's, and another consumer's of this process
        state = slot_state(self.connection(), stream.slot)
        if not state.exists:
            self._recover(stream)
            return None
        self._check_lag(state.lag_bytes)
        self._checked_at = time.monotonic()
        deadline = time.monotonic() + IN_USE_SECONDS
        while True:
            try:
                source = SlotStream(
                    self.dsn,
                    stream.slot,
                    stream.publication,
                    stream.applied_lsn,
                    state.confirmed_lsn or 0,
                )
                break
            except psycopg.errors.ObjectInUse as exc:  # a session that is ending holds it
                if time.monotonic() > deadline:
                    raise OperationalError(
                        f"replication slot {stream.slot} is streamed by another session "
                        f"({first_line(exc)}): is another process applying this cache file's "
                        "stream? Close it, or end that session at the backend"
                    ) from exc
                time.sleep(0.2)
            except psycopg.errors.UndefinedObject:  # dropped since we looked
                self._recover(stream)
                return None
        self._source = source
        self._new_decoder()
        return source

    def _confirm(self, source: SlotStream, lsn: int, wait: float = 0.0) -> None:
        """Confirm to the backend what the cache file holds (it may recycle that WAL). Not
        after every batch: the position is safe in the file already."""
        faults.hit("stream_advance", self.faults)  # applied and stored, not confirmed
        source.confirm(lsn, wait)
        self._confirmed_at = time.monotonic()

    def _apply(self, stream: StreamRow, txns: list[Transaction]) -> None:
        """Apply in as few DuckDB transactions as correctness allows: a run of transactions
        that leaves the pending pulls as they are goes in one; a batch that needs a pull is
        halved until the one transaction that needs it is found (it goes with its pull)."""
        schema, catalog = self.store.load_schema(), self._catalog()
        remaining = list(txns)
        limit: int | None = None
        current: StreamRow | None = stream
        while remaining:
            current = current or load_stream(self.store.con)
            assert current is not None
            pendings = pending_pulls(self.store.con)  # only pulls (this thread) add to them
            group = run_of(remaining, pendings)[:limit]
            try:
                with self._arranging(), self.store.transaction() as con:
                    if self.arrangements.position != current.applied_lsn:
                        self.arrangements.clear()  # (another consumer applied batches since)
                    done = apply_transactions(
                        con,
                        schema,
                        catalog,
                        current,
                        group,
                        pendings,
                        self.faults,
                        self.arrangements,
                    )
                    self.store.changed(done.views)
                    # (a batch must land: over the budget if evicting cannot make room)
                    within_budget(
                        self.store, schema, Report("stream batch", "stream"), strict=False
                    )
                self.arrangements.position = group[-1].end_lsn  # (committed)
            except NeedsPull as need:
                if len(group) > 1:
                    limit = len(group) // 2
                    continue
                self._upquery(schema, catalog, group[0], need)
            for txn in group:
                if txn.spill is not None:
                    self.spilled += 1
                txn.discard()  # (applied: its spilled pieces are not needed any more)
            remaining = remaining[len(group) :]
            limit, current = None, None  # moved on: read again

    @contextlib.contextmanager
    def _arranging(self) -> t.Iterator[None]:
        """The arrangements are forgotten when what the batch did to them is rolled back
        (enter it before the DuckDB transaction: a COMMIT that fails rolls back too); a
        batch that failed before making or changing one (a NeedsPull of a base view) leaves
        them."""
        self.arrangements.touched = False
        try:
            yield
        except BaseException:
            if self.arrangements.touched:
                self.arrangements.clear()
            raise

    def _new_decoder(self) -> None:
        """A decoder for a new session; the last one's unfinished transactions dropped."""
        self._decoder.close()
        self._decoder = Transactions(spill_dir=self._spill, spill_changes=self.spill_changes)

    @property
    def stream_blocks(self) -> int:
        """Blocks of transactions in progress the current session has read (protocol 2)."""
        return self._decoder.blocks

    def _catalog(self) -> Catalog:
        """The shadow catalog, read again only after DDL or a reflect saved it."""
        version = self.store.catalog_version
        if self._catalog_at is None or self._catalog_at[0] != version:
            self._catalog_at = (version, self.store.load_catalog())
        return self._catalog_at[1]

    def _pass_idle(self, stream: StreamRow, reached: int) -> None:
        """Everything committed before ``reached`` is applied: every pull whose transactions
        all committed before it is passed (the stream holds all it saw), with no transaction
        to show it."""
        if not any(p.until_lsn <= reached for p in pending_pulls(self.store.con)):
            return  # (the common case, seen without a transaction: only this thread passes)
        with self.store.transaction() as con:
            pendings = pending_pulls(con)
            passed = [p for p in pendings if p.until_lsn <= reached]
            if not passed:
                return
            schema = self.store.load_schema()
            stream_time = stream.stream_time
            for pending in passed:
                con.execute(
                    "DELETE FROM mtcache.stream_pulls WHERE snapshot_id = ?", [pending.snapshot_id]
                )
                stream_time = later(stream_time, pending.backend_time)
            applied = Applied()
            held = [p.snapshot_id for p in pendings if p not in passed]
            stamp_regions(con, schema, stream, stream.applied_lsn, stream_time, held, applied)
            self.store.changed(applied.views)

    def _upquery(
        self, schema: CacheSchema, catalog: Catalog, txn: Transaction, need: NeedsPull
    ) -> None:
        """Pull what ``txn`` brings in that the stream does not carry, in the backend's
        snapshot now, and apply ``txn`` in the same DuckDB transaction (the pull's regions
        skip it: the snapshot holds it)."""
        self.upqueries += 1

        def then(con: duckdb.DuckDBPyConnection, _: int) -> None:
            current = load_stream(con)
            assert current is not None
            if self.arrangements.position != current.applied_lsn:
                self.arrangements.clear()
            done = apply_transactions(
                con,
                schema,
                catalog,
                current,
                [txn],
                pending_pulls(con),
                self.faults,
                self.arrangements,
            )
            self.store.changed(done.views)

        maintainer = Maintainer(self.store, self.dsn)
        with self._arranging():  # (the pull and the transaction land together, or neither)
            maintainer._run("stream upquery", schema, need.seeds, need.admitted, then=then)
        self.arrangements.position = txn.end_lsn

    # -- trouble -------------------------------------------------------------------------------

    def _report(self, problem: str) -> None:
        with self.store.transaction() as con:
            con.execute("UPDATE mtcache.stream SET problem = ?", [problem])
        log.error("%s", problem)

    def _check_lag(self, lag: int | None) -> None:
        if lag is not None and lag > self.lag_limit:
            text = (
                f"the replication slot holds {lag} bytes of WAL, over the limit of "
                f"{self.lag_limit}: the consumer is behind"
            )
            if self._warned != "lag":
                log.warning("%s", text)
                self._warned = "lag"
        elif self._warned == "lag":
            self._warned = None

    def _recover(self, stream: StreamRow) -> None:
        """The slot is gone (dropped at the backend): make a new one and pull every
        continuously maintained region again, lined up with it."""
        log.warning(
            "replication slot %s is gone at the backend: making it again and pulling "
            "the continuously maintained views anew",
            stream.slot,
        )
        schema = self.store.load_schema()
        with create_slot(self.dsn, stream.slot) as start, self.store.transaction() as con:
            con.execute("DELETE FROM mtcache.stream_pulls")
            con.execute(
                "UPDATE mtcache.stream SET applied_lsn = ?, problem = NULL", [start.consistent_lsn]
            )
            for name in schema.continuous_views():  # the copies missed changes too: pulled
                if schema.views[name].is_derived:  # again with every view reading them
                    con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
            con.execute("DELETE FROM mtcache.view_state WHERE starts_with(view, ?)", [AUX_PREFIX])
        maintainer = Maintainer(self.store, self.dsn)
        for name in schema.continuous_views():
            if not schema.views[name].is_gray:
                maintainer.refresh(name)

    # -- running ---------------------------------------------------------------------------------

    def catch_up(self, timeout: float = 60.0) -> int:
        """Apply until the stream has passed the backend's WAL position of now (a mark made
        in the WAL: everything committed before the call is applied); the number of
        transactions applied."""
        target = wal_mark(self.connection())
        deadline = time.monotonic() + timeout
        total, marked_again = 0, False
        while True:
            applied = self.step(confirm=False, wait=self.poll)
            total += applied
            position = self.position
            if position is None and self._source is None:
                stream = load_stream(self.store.con)
                if stream is None or stream.problem is not None:
                    problem = stream.problem if stream is not None else None
                    raise OperationalError(f"the stream cannot be applied: {problem or 'none'}")
            source = self._source
            if (position is not None and position > target) or (
                source is not None and source.reached > target
            ):
                if pending_pulls(self.store.con):
                    self.step(confirm=False)  # passes the pulls the stream has reached
                if pending_pulls(self.store.con) and not marked_again:
                    # a pull made during the call (an upquery) may have read past every
                    # position the server has reported: mark the WAL again and go on until
                    # the stream passes that mark, and with it the pull
                    target, marked_again = wal_mark(self.connection()), True
                    continue
                return total
            if time.monotonic() > deadline:
                raise OperationalError(
                    f"the stream did not reach {lsn_text(target)} in {timeout:g} s"
                )
            if not applied and source is not None:
                source.ping()  # where is the server? (its reply moves `reached`)

    def start(self) -> None:
        if load_stream(self.store.con) is not None:
            with contextlib.suppress(duckdb.Error), self.store.transaction() as con:
                # what `mtcache status` compares the slot's lag with
                con.execute(
                    "INSERT OR REPLACE INTO mtcache.meta VALUES ('stream_lag_limit', ?)",
                    [str(self.lag_limit)],
                )
        self._loop.start(self._run)

    def stop(self) -> None:
        self._loop.stop()
        self.close()

    def _run(self) -> None:
        while not self._loop.stopping.is_set():
            try:
                if load_stream(self.store.con) is None:  # no continuous view (yet)
                    self.release()
                    self._loop.stopping.wait(IDLE_SECONDS)
                    continue
                applied = self.step()
            except Exception as exc:  # the backend away, mostly: try again later
                self._close()
                if self._warned != "error":
                    log.warning("stream consumer: %s (retrying)", first_line(exc))
                    self._warned = "error"
                self._loop.stopping.wait(2.0)
                continue
            if self._warned == "error":
                log.warning("stream consumer: applying again")
                self._warned = None
            if not applied:
                self._wait(self.poll)

    def _wait(self, seconds: float) -> None:
        """Until the server sends something (or ``seconds``), outside the stream lock."""
        source = self._source
        if source is None:
            self._loop.stopping.wait(seconds)
            return
        with contextlib.suppress(OSError, ValueError):  # released meanwhile: no matter
            select.select([source.fileno()], [], [], seconds)

    def close(self) -> None:
        """End the streaming session, confirming the slot up to what the file holds (best
        effort: the file is what counts), and close the backend connection (`step` and
        `catch_up` open them again)."""
        self.release(confirm=True)
        self._close()
        shutil.rmtree(self._spill, ignore_errors=True)

    def release(self, confirm: bool = False) -> None:
        """End the streaming session (the slot is free; the next step starts another from
        the file's position), confirming the file's position first if ``confirm``."""
        with self.store.stream_lock:
            source, self._source = self._source, None
            if source is None:
                return
            self._new_decoder()  # (what it read goes with the session)
            lsn = None
            if confirm:
                with contextlib.suppress(duckdb.Error):
                    stream = load_stream(self.store.con)
                    lsn = stream.applied_lsn if stream is not None else None
            with contextlib.suppress(Exception):
                source.close(confirm=lsn)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> psycopg.Connection[t.Any]:
        """The consumer's plain backend connection (slot state, WAL marks), opened if needed."""
        if self._conn is None or self._conn.closed:
            conn = connect_backend(self.dsn, autocommit=True)
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO, YMD'")
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        self.release()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def spill_dir(path: Path) -> Path:
    """Where a consumer of the cache file at ``path`` spills big transactions: a private
    directory of its own beside the file. Those of processes gone are removed (a killed
    consumer's: the backend sends their transactions again)."""
    parent = path.with_name(path.name + ".spill")
    make_private_dirs(parent)
    for left in parent.iterdir():
        pid = left.name.split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    found = parent / f"{os.getpid()}-{next(_CONSUMERS)}"
    make_private_dirs(found)
    return found


_CONSUMERS = itertools.count()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
