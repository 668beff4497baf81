"""Clients' conversations opened from their startup packets, for one server: the parameters
split between the cache's settings (``mtcache.*``, as parameters or in ``options``) and the
backend session's; the session made, its backend connection opened at once only when the
client's parameters change what the backend reports; the ParameterStatus values and the
client encoding the answers are written in. What all of a server's conversations share is
kept here: the backend's reported defaults, its descriptions of statements, the pool of
backend connections (transaction pooling) and the statement counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cache.backend.session_pool import SessionPool
from cache.engine.conversation.conversation import Conversation
from cache.engine.conversation.reported import BackendDefaults, Describer, reported_to
from cache.engine.conversation.statements import Out
from cache.engine.conversation.statistics import StatementStats
from cache.engine.engine import Engine, SessionOptions
from cache.engine.session import Session
from cache.wire import protocol, values
from sql_ext.errors import BackendUnavailableError, NotSupportedError


@dataclass
class Opened:
    """A conversation just opened, and what its client is told before its first message."""

    conversation: Conversation
    reported: dict[str, str]  # ParameterStatus, in order


class Conversations:
    """Opens the conversations of one server's clients over one engine (see the module)."""

    def __init__(
        self,
        engine: Engine,
        *,
        pool: SessionPool | None = None,
        currency_bound: float | None = None,
        backend_settings: dict[str, str] | None = None,
        max_result_bytes: int | None = None,
        statement_stats: StatementStats | None = None,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.currency_bound = currency_bound
        self.backend_settings = backend_settings or {}  # the server's limits, as settings
        self.max_result_bytes = max_result_bytes
        self.statement_stats = statement_stats
        # what the backend reports (its copy in the cache file while it is down)
        self.reported = BackendDefaults(engine.backend, engine.store.for_thread())
        self.describe = Describer(engine.backend, engine.store)

    def open(
        self,
        parameters: dict[str, str],
        credentials: dict[str, str] | None,
        out: Out,
        next_message: Callable[[], protocol.Message],
    ) -> Opened:
        """A client's conversation (``parameters``: its startup packet's; ``credentials``:
        how its backend connection logs in). Its errors are the PEP 249 tree's, and nothing
        is left open by one."""
        ours, backend_parameters = split_parameters(parameters)
        defaults = self.reported.current()
        connect = _needs_backend_at_start(backend_parameters, defaults)
        for name, value in self.backend_settings.items():
            backend_parameters.setdefault(name, value)  # (the client's own come first)
        session = Session(
            self.engine,
            SessionOptions.of(autocommit=True, currency_bound=self.currency_bound),
            backend_parameters=backend_parameters,
            backend_credentials=credentials,
            connect=connect,
            time_zone=defaults.get("TimeZone"),
            pool=self.pool,
        )
        try:
            if connect and session.link.if_open() is None:
                # its parameters change what the backend reports (another role, a setting):
                # told nothing but the backend's own answer, never the defaults kept
                raise BackendUnavailableError(
                    "the backend is unreachable, and this session's startup parameters (its "
                    "role or settings) need its backend connection at once: connect again "
                    "when the backend is back, or as the cache server's own role"
                )
            # the client's DEALLOCATE ALL / DISCARD ALL reach this connection past psycopg,
            # which must then hold no prepared statements of its own (it prepares what the
            # engine asks five times)
            session.set_backend_setting("prepare_threshold", None)
            for name, value in ours.items():  # the cache's settings given at startup
                session.set_setting(name, value, default=True)
            reported = reported_to(session, defaults, backend_parameters)
            encoding = reported.get("client_encoding", "UTF8")
            codec = values.codec_of(encoding, reported.get("server_encoding", "UTF8"))
            if codec is None:
                raise NotSupportedError(values.unconvertible(encoding))
        except BaseException:
            session.close()
            raise
        settings = values.OutputSettings(
            codec=codec,
            extra_float_digits=_int(backend_parameters.get("extra_float_digits"), 1),
            date_style=reported.get("DateStyle", "ISO, MDY"),
        )
        conversation = Conversation(
            session,
            out,
            settings,
            self.describe,
            next_message,
            reported,
            max_result_bytes=self.max_result_bytes,
            statement_stats=self.statement_stats,
        )
        return Opened(conversation, reported)

    def close(self) -> None:
        self.reported.close()


def split_parameters(parameters: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(settings of ours, parameters for the backend session): ``mtcache.*`` settings come as
    startup parameters or as ``-c mtcache.x=y`` in ``options``."""
    ours: dict[str, str] = {}
    backend: dict[str, str] = {}
    for name, value in parameters.items():
        if name in ("user", "database", "replication") or name.startswith("_pq_."):
            continue
        if name.startswith("mtcache."):
            ours[name] = value
        elif name == "options":
            kept = []
            words = value.split()
            i = 0
            while i < len(words):
                word = words[i]
                setting = None
                if word == "-c" and i + 1 < len(words):
                    setting, i = words[i + 1], i + 2
                elif (word.startswith("-c") and len(word) > 2) or word.startswith("--"):
                    setting, i = word[2:], i + 1
                else:
                    kept.append(word)
                    i += 1
                    continue
                key, _, val = setting.partition("=")
                if key.startswith("mtcache."):
                    ours[key] = val
                else:
                    kept += ["-c", setting]
            if kept:
                backend["options"] = " ".join(kept)
        else:
            backend[name] = value
    backend["user"] = parameters.get("user", "")
    return ours, backend


def _needs_backend_at_start(parameters: dict[str, str], defaults: dict[str, str]) -> bool:
    """Whether the session must open its backend connection now: its parameters change what
    the backend reports (anything but the application name and a client encoding the
    defaults already have)."""
    for name, value in parameters.items():
        if name in {"application_name", "user"}:
            continue
        same = (defaults.get("client_encoding", "UTF8").replace("-", ""), "UTF8", "UNICODE")
        if name == "client_encoding" and value.upper().replace("-", "") in same:
            continue
        return True
    return parameters.get("user") != defaults.get("session_authorization")


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


__all__ = ["Conversations", "Opened", "split_parameters"]
