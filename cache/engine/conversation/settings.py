"""What a client was told of its session's settings, kept true as its statements change them:
the ParameterStatus values (reported settings: TimeZone, DateStyle, client_encoding, ...),
the settings that shape PostgreSQL's text output without being reported (extra_float_digits,
bytea_output: read after a statement that may set them), the client encoding the answers
are written in, and the session's position when asked for (``mtcache.report_position``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from psycopg import pq
from psycopg.pq import ExecStatus

from cache.engine.conversation.pipeline import BackendPipeline
from cache.engine.conversation.statements import Out, Refusal
from cache.engine.session import Session
from cache.wire import protocol, values

_POSITION = "mtcache.position"  # reported with mtcache.report_position
# SET client_encoding / SET NAMES, and the encoding it names
_SETS_ENCODING = re.compile(
    r"\s*SET\s+(?:SESSION\s+|LOCAL\s+)?(?:client_encoding\s*(?:TO|=)|NAMES)\s*['\"]?([\w-]+)",
    re.IGNORECASE,
)


class ClientSettings:
    """One client's view of its session's settings (see the module). ``notice``: how the
    cache's own NOTICE reaches the client."""

    def __init__(
        self,
        session: Session,
        out: Out,
        pipeline: BackendPipeline,
        notice: Callable[[str], None],
        settings: values.OutputSettings,
        reported: dict[str, str],
    ) -> None:
        self.session = session
        self.out = out
        self.pipeline = pipeline
        self._notice = notice
        self.settings = settings  # how local answers are encoded for the client
        self.reported = reported  # the ParameterStatus values the client has
        self.reported_bytes: dict[bytes, bytes] = {}  # as libpq last gave them
        self.output_changed = False  # a statement may have changed an output setting

    @property
    def codec(self) -> str:
        return self.settings.codec

    @property
    def server_encoding(self) -> str:
        return self.reported.get("server_encoding", "UTF8")

    def check_encoding(self, text: str) -> None:
        """A SET of a client encoding the server cannot convert is refused before it reaches
        the backend (the session goes on in its encoding)."""
        found = _SETS_ENCODING.match(text)
        named = found.group(1) if found is not None else "DEFAULT"
        if named.upper() != "DEFAULT" and values.codec_of(named, self.server_encoding) is None:
            raise Refusal("0A000", values.unconvertible(named))

    def client_has(self, name: str, value: str) -> None:
        """The client was told this value of a reported setting."""
        self.reported[name] = value
        if name == "client_encoding":
            codec = values.codec_of(value, self.server_encoding)
            if codec is not None:
                self.settings = dataclasses.replace(self.settings, codec=codec)
        if name == "DateStyle":
            self.settings = dataclasses.replace(self.settings, date_style=value)

    def changes(self) -> None:
        """ParameterStatus for every reported setting the backend session changed (SET
        TimeZone, ...)."""
        conn = self.session.link.if_open()
        if conn is None:
            return
        pgconn = conn.pgconn
        reported, seen = self.reported, self.reported_bytes
        for name, value in list(reported.items()):
            key = name.encode()
            found = pgconn.parameter_status(key)  # (libpq's bytes: compared undecoded)
            if found is None or found == seen.get(key):
                continue
            seen[key] = found
            now = found.decode("ascii", "replace") if name == "client_encoding" else None
            if now is not None and values.codec_of(now, self.server_encoding) is None:
                # set by other means than SET (a function's set_config): set back
                back = b"SELECT set_config('client_encoding', $1, false)"
                self.pipeline.own_statement(pgconn, back, [value.encode()])
                self._notice(values.unconvertible(now))
                continue
            now = conn.info.parameter_status(name)
            if now is not None and now != value:
                self.client_has(name, now)
                self.out(protocol.parameter_status(name, now))

    def read_output(self, status: pq.TransactionStatus) -> None:
        """After a statement that may have set extra_float_digits or bytea_output (which
        ParameterStatus does not report): read them. A SET LOCAL ends with its transaction,
        so they are read again at its end."""
        conn = self.session.link.if_open()
        if conn is None or status == pq.TransactionStatus.INERROR:
            return
        found = self.pipeline.own_statement(
            conn.pgconn,
            b"SELECT current_setting('extra_float_digits'), current_setting('bytea_output')",
        )
        if found is not None and found.status == ExecStatus.TUPLES_OK:
            digits, output = (found.get_value(0, i) or b"" for i in range(2))
            self.settings = dataclasses.replace(
                self.settings, extra_float_digits=int(digits), bytea_output=output.decode()
            )
        self.output_changed = status == pq.TransactionStatus.INTRANS

    def report_position(self) -> None:
        """ParameterStatus mtcache.position when the session's position moved (asked for
        with mtcache.report_position): what a client gives another cache server as
        mtcache.min_position."""
        value = self.session.setting("mtcache.position")
        if value != self.reported.get(_POSITION):
            self.reported[_POSITION] = value
            self.out(protocol.parameter_status(_POSITION, value))


__all__ = ["ClientSettings"]
