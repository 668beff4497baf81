"""The engine's answers as the client's messages: a result's rows encoded as PostgreSQL's
output functions write them, in the formats the client asked for (`cache.wire.values`), a
row-limited Execute's rows kept in its portal, the cache's own NOTICEs, and the server's
limit on a local answer's size."""

from __future__ import annotations

from cache.engine.conversation.settings import ClientSettings
from cache.engine.conversation.statements import Out, Portal, Refusal, result_fields
from cache.engine.link import relay
from cache.engine.result import Result
from cache.engine.session import Session
from cache.wire import protocol, values
from cache.wire.oids import OID


class LocalAnswers:
    """One conversation's writer of the engine's answers (see the module)."""

    client: ClientSettings  # (set once the conversation made it: it notices through this)

    def __init__(self, session: Session, out: Out) -> None:
        self.session = session
        self.out = out
        self.noticed: list[str] = []  # backend notices sent during the current statement
        self.max_result_bytes: int | None = None  # a local answer's encoded rows, at most

    def execute(self, portal: Portal, result: Result, max_rows: int) -> None:
        """The engine's answer to an Execute: in the portal's result formats, at most
        ``max_rows`` rows now (the rest kept in the portal)."""
        formats = relay.result_formats(portal.bind.result_formats, len(result.columns or ()))
        if max_rows > 0 and result.rows is not None:
            self.send(result, describe=False, formats=formats, into=portal.holder())
            self.out(portal.next_rows(max_rows))
            return
        self.send(result, describe=False, formats=formats)

    def send(
        self, result: Result, *, describe: bool, formats: list[int] | None, into: Out | None = None
    ) -> None:
        """A result's messages: its NOTICEs (but the backend's, sent as they came), its
        RowDescription if ``describe``, its rows and its CommandComplete."""
        out = into or self.out
        for notice in result.notices:
            if notice in self.noticed:  # the backend's, sent as it came
                self.noticed.remove(notice)
                continue
            self.notice(notice)
        columns = result.columns
        if result.rows is None or columns is None:
            out(protocol.command_complete(result.status or ""))
            return
        if formats is None:
            formats = [0] * len(columns)
        if describe:
            out(protocol.row_description(result_fields(result, formats)))
        encoders = self.encoders(result, formats)
        limit = self.max_result_bytes
        if limit is None:
            for row in result.rows:
                out(protocol.data_row(row, encoders))
        else:  # (encoded whole first: a result past the limit sends none of its rows)
            rows, total = [], 0
            for row in result.rows:
                data = protocol.data_row(row, encoders)
                total += len(data)
                if total > limit:
                    raise Refusal(
                        "54000",
                        f"the result is larger than the cache server's "
                        f"limit of {limit} bytes (--max-result-bytes): ask for "
                        "fewer rows (LIMIT), or read it in parts through a cursor",
                    )
                rows.append(data)
            for data in rows:
                out(data)
        out(protocol.command_complete(result.status or f"SELECT {len(result.rows)}"))

    def encoders(self, result: Result, formats: list[int]) -> tuple[values.Encoder, ...]:
        """How each column of an engine's result is encoded, in these formats."""
        oids = tuple(c.type_oid or OID.text for c in result.columns or ())
        return values.encoders(oids, tuple(formats), self.client.settings)

    def notice(self, notice: str) -> None:
        """A NOTICE of the cache's own (with its JSON detail, if it has one)."""
        self.out(
            protocol.error_response(
                "00000",
                notice,
                severity="NOTICE",
                notice=True,
                detail=getattr(notice, "detail", None),
            )
        )

    def provenance(self) -> None:
        """After a statement the backend answered: its provenance NOTICE, if the session asks
        for one (``mtcache.provenance``)."""
        notice = self.session.statement_notice()
        if notice is not None:
            self.notice(notice)


__all__ = ["LocalAnswers"]
