"""The protocol state of a client connection (`cache.wire.state`), fed messages and the
server's events alone: no session, no socket, no database. Each case is a transition
PostgreSQL's ``PostgresMain`` makes."""

from __future__ import annotations

import pytest

from cache.wire import protocol
from cache.wire.state import Phase, ProtocolState, StateError, Step

PARSE = protocol.Parse(b"", b"select 1", ())
BIND = protocol.Bind(b"", b"", (), (), ())
EXECUTE = protocol.Execute(b"", 0)
DESCRIBE = protocol.Describe(b"P", b"")
CLOSE = protocol.Close(b"S", b"")
SYNC = protocol.Sync()
FLUSH = protocol.Flush()
QUERY = protocol.Query(b"select 1")
TERMINATE = protocol.Terminate()
COPY_DATA = protocol.CopyData(b"1\n")


def test_a_query_is_answered_then_ready() -> None:
    state = ProtocolState()
    assert state.receive(QUERY) is Step.ANSWER
    assert state.phase is Phase.SIMPLE
    assert state.ready()
    assert state.phase is Phase.IDLE


def test_an_error_in_a_query_ends_with_its_ready_and_drops_nothing_after() -> None:
    state = ProtocolState()
    state.receive(QUERY)
    state.error()
    assert state.phase is Phase.SIMPLE and not state.ignoring
    assert state.ready()
    assert state.receive(PARSE) is Step.ANSWER


def test_extended_messages_are_answered_until_sync() -> None:
    state = ProtocolState()
    for message in (PARSE, BIND, DESCRIBE, EXECUTE, CLOSE, FLUSH):
        assert state.receive(message) is Step.ANSWER
        assert state.phase is Phase.EXTENDED
    assert state.receive(SYNC) is Step.SYNC
    assert state.ready()
    assert state.phase is Phase.IDLE


def test_after_an_extended_error_everything_but_sync_and_terminate_is_dropped() -> None:
    state = ProtocolState()
    state.receive(PARSE)
    state.error()
    assert state.phase is Phase.FAILED and state.ignoring
    for message in (BIND, EXECUTE, DESCRIBE, CLOSE, FLUSH, QUERY, COPY_DATA):
        assert state.receive(message) is Step.IGNORE
        assert state.ignoring
    # the Sync's queued answers are still dropped while it is answered: FAILED until ready
    assert state.receive(SYNC) is Step.SYNC
    assert state.ignoring
    assert state.ready()
    assert state.receive(QUERY) is Step.ANSWER


def test_a_second_error_before_sync_keeps_dropping() -> None:
    state = ProtocolState()
    state.receive(EXECUTE)
    state.error()
    state.error()
    assert state.phase is Phase.FAILED


def test_terminate_ends_the_session_even_after_an_error() -> None:
    state = ProtocolState()
    state.receive(PARSE)
    state.error()
    assert state.receive(TERMINATE) is Step.END
    assert state.ended
    assert state.receive(QUERY) is Step.IGNORE
    assert not state.ready()


def test_a_fatal_error_ends_the_session_with_no_ready_after_it() -> None:
    state = ProtocolState()
    state.receive(QUERY)
    state.fatal()
    assert state.ended
    assert not state.ready()  # (libpq would take a ReadyForQuery for a live session)
    assert state.receive(SYNC) is Step.IGNORE


def test_copy_data_outside_copy_is_dropped() -> None:
    state = ProtocolState()
    for message in (COPY_DATA, protocol.CopyDone(), protocol.CopyFail(b"no")):
        assert state.receive(message) is Step.IGNORE
        assert state.phase is Phase.IDLE


def test_copy_in_takes_data_and_drops_flush_and_sync() -> None:
    state = ProtocolState()
    state.receive(QUERY)
    state.copy_in()
    assert state.phase is Phase.COPY_IN
    assert state.receive(COPY_DATA) is Step.COPY
    assert state.receive(FLUSH) is Step.IGNORE
    assert state.receive(SYNC) is Step.IGNORE
    # another message fails the COPY (the conversation says so): it is the COPY's to judge
    assert state.receive(PARSE) is Step.COPY
    assert state.receive(protocol.CopyDone()) is Step.COPY
    state.copy_over()
    assert state.phase is Phase.SIMPLE
    assert state.ready()


def test_an_error_during_an_extended_copy_fails_the_cycle() -> None:
    state = ProtocolState()
    state.receive(EXECUTE)
    state.copy_in()
    state.error()
    assert state.phase is Phase.FAILED


def test_an_error_during_a_query_copy_goes_back_to_the_query() -> None:
    state = ProtocolState()
    state.receive(QUERY)
    state.copy_in()
    state.error()
    assert state.phase is Phase.SIMPLE


def test_a_run_taken_whole_is_an_extended_cycle() -> None:
    state = ProtocolState()
    state.extended()
    state.error()
    assert state.ignoring
    assert state.ready()
    assert state.phase is Phase.IDLE
    state.receive(PARSE)  # (a cycle under way: the run goes on with it)
    state.extended()
    assert state.phase is Phase.EXTENDED


def test_transitions_the_protocol_does_not_have_are_the_servers_bugs() -> None:
    state = ProtocolState()
    with pytest.raises(StateError):
        state.copy_in()  # (no statement runs)
    state.receive(QUERY)
    with pytest.raises(StateError):
        state.extended()
    state.copy_in()
    with pytest.raises(StateError):
        state.ready()


def test_messages_from_the_wire_move_it() -> None:
    """The same transitions, fed the bytes a client sends (`protocol.FrontendReader`)."""
    reader = protocol.FrontendReader()
    reader.feed(
        b"P\x00\x00\x00\x10\x00select 1\x00\x00\x00"  # Parse
        b"B\x00\x00\x00\x0c\x00\x00\x00\x00\x00\x00\x00\x00"  # Bind
        b"E\x00\x00\x00\x09\x00\x00\x00\x00\x00"  # Execute
        b"S\x00\x00\x00\x04"  # Sync
    )
    state = ProtocolState()
    steps = []
    while (message := reader.next_message()) is not None:
        steps.append(state.receive(message))
        if isinstance(message, protocol.Bind):
            state.error()  # (say the Bind failed)
    assert steps == [Step.ANSWER, Step.ANSWER, Step.IGNORE, Step.SYNC]
    assert state.ready()
