"""Core Raft ``Message`` values to and from the ConsensusService protos, both directions.

The core speaks one-way messages; the wire speaks request/response RPCs:

=====================================  ===========================================
core message                           wire
=====================================  ===========================================
APPEND, HEARTBEAT                      ``UpdateConsensusRequest`` (``is_heartbeat``)
APPEND_RESPONSE, HEARTBEAT_RESPONSE    ``UpdateConsensusResponse`` (``is_heartbeat``)
VOTE, PRE_VOTE                         ``RequestVoteRequest`` (``is_pre_vote``)
VOTE_RESPONSE, PRE_VOTE_RESPONSE       ``RequestVoteResponse`` (``is_pre_vote``)
TIMEOUT_NOW                            ``TimeoutNowRequest`` (answered by an empty response)
=====================================  ===========================================

Node ids are server uuids: ``src``/``dst`` become caller/dest uuids on a request; a response
names only its responder, so decoding one needs the request it answers (``dst`` is the
request's ``src``).

The conversion is exact: ``decode(encode(m)) == m`` for every message the core can produce.
A message carrying a field its RPC has no room for is refused with ``ValueError`` rather than
silently losing the field.

Decoding validates what a peer sent, as far as it can without the receiver's state, and
raises ``MalformedRequest`` (a ``ValueError``, which the tablet server's service boundary
maps to INVALID_ARGUMENT) so a nonsensical request never reaches the core:

- uuids present and addressed to this server (``WrongServerUuid`` otherwise), the caller
  not the receiver itself;
- every term and index at most ``MAX_TERM`` / ``MAX_INDEX`` (int63, though the fields are
  uint64): a replica can then always campaign one term past any term it may adopt, and
  nothing out of range is stepped or persisted (the report that started this: a heartbeat
  of term 2**64 - 1 left every replica a pre-candidate unable to ask for the next term);
- a request's term is at least 1 (term 0 has no leader or candidate);
- a log position (``prev_log_*``, ``last_log_*``) is (0, 0) or names an entry, which has a
  term of at least 1 and no later than its sender's term -- for a vote strictly earlier
  (a candidate holds no entry of the term it asks for);
- entries of a known type that directly follow ``prev_log_index``, contiguous, terms never
  going back, none older than ``prev_log_term`` nor newer than ``caller_term``;
- a heartbeat carries no entries and no log position; a leader announces no transfer to
  itself.

What needs the receiver's state (its term, its known leader, its lease) is the core's check
(``Raft.step``); the voter check is the server's (``ConsensusRequestHandler``).  Responses
get the range check too and fail with ``MalformedResponse``, which the transports treat as a
lost message.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlet.consensus.core.membership import Membership
from raftlet.consensus.core.types import (
    MAX_INDEX,
    MAX_TERM,
    NO_NODE,
    Entry,
    EntryType,
    Message,
    MessageType,
)
from raftlet.consensus.log.codec import check_batch
from raftlet.proto import consensus_pb2 as pb

__all__ = [
    "MalformedRequest",
    "MalformedResponse",
    "WireRequest",
    "WrongServerUuid",
    "decode_response",
    "encode_request",
    "entries_from_pb",
    "entries_to_pb",
    "message_from_timeout_now_request",
    "message_from_update_request",
    "message_from_update_response",
    "message_from_vote_request",
    "message_from_vote_response",
    "timeout_now_request_from_message",
    "update_request_from_message",
    "update_response_from_message",
    "vote_request_from_message",
    "vote_response_from_message",
]

WireRequest = pb.UpdateConsensusRequest | pb.RequestVoteRequest | pb.TimeoutNowRequest


_TO_PB = {
    EntryType.NORMAL: pb.NORMAL,
    EntryType.NO_OP: pb.NO_OP,
    EntryType.CONFIG: pb.CONFIG_CHANGE,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


class MalformedRequest(ValueError):
    """A peer's request cannot be a Raft message (INVALID_ARGUMENT)."""


class WrongServerUuid(MalformedRequest):
    """The request is addressed to another server: the caller reached a stale address (e.g.
    a server restarted elsewhere on a reused port).  A subclass so the service boundary can
    say WRONG_SERVER_UUID instead of a generic INVALID_ARGUMENT."""

    def __init__(self, dest_uuid: str, server_uuid: str) -> None:
        super().__init__(f"request is for server {dest_uuid!r}, but this is {server_uuid!r}")
        self.dest_uuid = dest_uuid
        self.server_uuid = server_uuid


class MalformedResponse(ValueError):
    """A peer's answer cannot be stepped into the core (garbage, a mismatched kind, or an
    error the responder reported).  The transport treats it as a lost message."""


# --- entries ------------------------------------------------------------------------------


def entries_to_pb(entries: Sequence[Entry]) -> list[pb.EntryPB]:
    return [
        pb.EntryPB(term=e.term, index=e.index, type=_TO_PB[e.type], payload=e.data) for e in entries
    ]


def entries_from_pb(
    entries: Sequence[pb.EntryPB], prev_index: int, prev_term: int, caller_term: int
) -> tuple[Entry, ...]:
    """Entries of an UpdateConsensusRequest, checked to be a piece of a Raft log that
    directly follows (prev_index, prev_term) and was written no later than caller_term."""
    if not entries:
        return ()
    for e in entries:
        _check_range(e.index, MAX_INDEX, f"entry index {e.index}")
        _check_range(e.term, MAX_TERM, f"entry {e.index}'s term {e.term}")
        if e.type not in _FROM_PB:
            name = pb.EntryType.Name(e.type) if e.type in pb.EntryType.values() else e.type
            raise MalformedRequest(f"entry {e.index} has unsupported type {name}")
        if e.type == pb.CONFIG_CHANGE:
            try:
                Membership.decode(e.payload)
            except ValueError as exc:
                raise MalformedRequest(f"entry {e.index} holds no membership: {exc}") from None
    first, last = entries[0], entries[-1]
    if first.index != prev_index + 1:
        raise MalformedRequest(
            f"entries start at index {first.index}, not right after prev_log_index {prev_index}"
        )
    reason = check_batch([(e.index, e.term) for e in entries])
    if reason is not None:
        raise MalformedRequest(reason)
    if first.term < prev_term:
        raise MalformedRequest(
            f"entry {first.index} has term {first.term}, older than prev_log_term {prev_term}"
        )
    if last.term > caller_term:
        raise MalformedRequest(
            f"entry {last.index} has term {last.term}, newer than caller_term {caller_term}"
        )
    return tuple(Entry(e.term, e.index, _FROM_PB[e.type], e.payload) for e in entries)


# --- encoding (core -> wire) ----------------------------------------------------------------


def _require_default(m: Message, fields: Sequence[str]) -> None:
    """Refuse a message whose wire form has no room for one of ``fields``."""
    for name in fields:
        value = getattr(m, name)
        if value:
            raise ValueError(f"{m.type.value} cannot carry {name}={value!r} over the wire")


_LIMITS = (
    ("term", MAX_TERM),
    ("log_term", MAX_TERM),
    ("index", MAX_INDEX),
    ("commit", MAX_INDEX),
    ("reject_hint", MAX_INDEX),
    ("context", MAX_INDEX),
    ("all_replicated", MAX_INDEX),
    ("leader_commit", MAX_INDEX),
)


def _check_int63(m: Message) -> None:
    for name, limit in _LIMITS:
        value = getattr(m, name)
        if not 0 <= value <= limit:
            raise ValueError(f"{m.type.value}.{name}={value} is outside [0, {limit}]")
    for e in m.entries:
        if not (0 <= e.index <= MAX_INDEX and 0 <= e.term <= MAX_TERM):
            raise ValueError(f"{m.type.value} entry ({e.index}, {e.term}) is out of range")


def update_request_from_message(m: Message, tablet_id: str) -> pb.UpdateConsensusRequest:
    if m.type not in (MessageType.APPEND, MessageType.HEARTBEAT):
        raise ValueError(f"{m.type.value} is not sent as UpdateConsensus")
    heartbeat = m.type is MessageType.HEARTBEAT
    _require_default(m, ("reject", "reject_hint", "transfer"))
    if heartbeat and m.entries:
        raise ValueError("a HEARTBEAT carries no entries")
    if not heartbeat:
        _require_default(m, ("leader_commit",))  # an APPEND's commit is the leader's
    _check_int63(m)
    return pb.UpdateConsensusRequest(
        tablet_id=tablet_id,
        caller_uuid=m.src,
        dest_uuid=m.dst,
        caller_term=m.term,
        prev_log_index=m.index,
        prev_log_term=m.log_term,
        entries=entries_to_pb(m.entries),
        committed_index=m.commit,
        is_heartbeat=heartbeat,
        read_round=m.context,
        transferee_uuid=m.transferee,
        all_replicated_index=m.all_replicated,
        leader_committed_index=m.leader_commit,
    )


def update_response_from_message(m: Message) -> pb.UpdateConsensusResponse:
    if m.type not in (MessageType.APPEND_RESPONSE, MessageType.HEARTBEAT_RESPONSE):
        raise ValueError(f"{m.type.value} is not an UpdateConsensus answer")
    _require_default(
        m, ("entries", "commit", "transfer", "transferee", "all_replicated", "leader_commit")
    )
    _check_int63(m)
    return pb.UpdateConsensusResponse(
        responder_uuid=m.src,
        responder_term=m.term,
        rejected=m.reject,
        last_log_index=m.index,
        conflict_term=m.log_term,
        conflict_index=m.reject_hint,
        is_heartbeat=m.type is MessageType.HEARTBEAT_RESPONSE,
        read_round=m.context,
    )


def vote_request_from_message(m: Message, tablet_id: str) -> pb.RequestVoteRequest:
    if m.type not in (MessageType.VOTE, MessageType.PRE_VOTE):
        raise ValueError(f"{m.type.value} is not sent as RequestVote")
    _require_default(
        m,
        (
            "entries",
            "commit",
            "reject",
            "reject_hint",
            "context",
            "transferee",
            "all_replicated",
            "leader_commit",
        ),
    )
    _check_int63(m)
    return pb.RequestVoteRequest(
        tablet_id=tablet_id,
        candidate_uuid=m.src,
        dest_uuid=m.dst,
        candidate_term=m.term,
        last_log_index=m.index,
        last_log_term=m.log_term,
        is_pre_vote=m.type is MessageType.PRE_VOTE,
        leader_transfer=m.transfer,
    )


def vote_response_from_message(m: Message) -> pb.RequestVoteResponse:
    if m.type not in (MessageType.VOTE_RESPONSE, MessageType.PRE_VOTE_RESPONSE):
        raise ValueError(f"{m.type.value} is not a RequestVote answer")
    _require_default(
        m,
        (
            "log_term",
            "index",
            "entries",
            "commit",
            "reject_hint",
            "transfer",
            "context",
            "transferee",
            "all_replicated",
            "leader_commit",
        ),
    )
    _check_int63(m)
    return pb.RequestVoteResponse(
        responder_uuid=m.src,
        responder_term=m.term,
        vote_granted=not m.reject,
        is_pre_vote=m.type is MessageType.PRE_VOTE_RESPONSE,
    )


def timeout_now_request_from_message(m: Message, tablet_id: str) -> pb.TimeoutNowRequest:
    if m.type is not MessageType.TIMEOUT_NOW:
        raise ValueError(f"{m.type.value} is not sent as TimeoutNow")
    _require_default(
        m,
        (
            "log_term",
            "index",
            "entries",
            "commit",
            "reject",
            "reject_hint",
            "transfer",
            "transferee",
            "all_replicated",
            "leader_commit",
        ),
    )
    _check_int63(m)
    return pb.TimeoutNowRequest(
        tablet_id=tablet_id, caller_uuid=m.src, dest_uuid=m.dst, caller_term=m.term
    )


def encode_request(m: Message, tablet_id: str) -> WireRequest:
    """The RPC request that carries the core's request ``m``; ValueError for a response
    type (responses travel as the answer of the RPC, never as a call of their own)."""
    if m.type in (MessageType.APPEND, MessageType.HEARTBEAT):
        return update_request_from_message(m, tablet_id)
    if m.type in (MessageType.VOTE, MessageType.PRE_VOTE):
        return vote_request_from_message(m, tablet_id)
    if m.type is MessageType.TIMEOUT_NOW:
        return timeout_now_request_from_message(m, tablet_id)
    raise ValueError(f"{m.type.value} is a response, not a request")


# --- decoding (wire -> core) ----------------------------------------------------------------


def _check_addressing(
    tablet_id: str, caller: str, dest: str, server_uuid: str | None, what: str
) -> None:
    if not tablet_id:
        raise MalformedRequest(f"{what}: tablet_id is missing")
    if not caller:
        raise MalformedRequest(f"{what}: caller uuid is missing")
    if not dest:
        raise MalformedRequest(f"{what}: dest_uuid is missing")
    if caller == dest:
        raise MalformedRequest(f"{what}: caller and dest are the same server {caller!r}")
    if server_uuid is not None and dest != server_uuid:
        raise WrongServerUuid(dest, server_uuid)


def _check_range(value: int, limit: int, what: str, least: int = 0) -> None:
    if not least <= value <= limit:
        raise MalformedRequest(f"{what} is outside [{least}, {limit}]")


def _check_term(term: int, what: str) -> None:
    """A request's own term: a leader's or candidate's, so at least 1, and int63."""
    _check_range(term, MAX_TERM, f"{what} {term}", least=1)


def _check_position(
    index: int, term: int, sender_term: int, which: str, sender: str, *, strict: bool = False
) -> None:
    """A log position a request names (``<which>_log_index`` / ``_log_term``): index 0 has
    no entry, so no term; any other index names an entry, which has a term of at least 1;
    and no entry can be newer than its sender's term (``strict``: nor of it)."""
    _check_range(index, MAX_INDEX, f"{which}_log_index {index}")
    if index == 0 and term != 0:
        raise MalformedRequest(f"{which}_log_term {term} given for index 0, which has no entry")
    if index != 0 and term == 0:
        raise MalformedRequest(f"{which}_log_index {index} given with term 0: no entry has it")
    if term > sender_term or (strict and term == sender_term):
        relation = "not older than" if term == sender_term else "newer than"
        raise MalformedRequest(f"{which}_log_term {term} is {relation} {sender} {sender_term}")


def message_from_update_request(
    req: pb.UpdateConsensusRequest, server_uuid: str | None = None
) -> Message:
    """APPEND or HEARTBEAT; with ``server_uuid``, also checks the request is addressed here.

    Every follower decodes one of these per append, so the checks run first as bare
    comparisons, without building the words of an error nobody will read; a request that
    fails any of them is decoded again by ``_checked_update_request``, whose checks say
    what is wrong.  A request accepted here is one that one accepts, decoded the same
    (``tests/unit/test_consensus_rpc_codec.py`` holds the two to that)."""
    caller = req.caller_uuid
    dest = req.dest_uuid
    term = req.caller_term
    prev_index = req.prev_log_index
    prev_term = req.prev_log_term
    commit = req.committed_index
    read_round = req.read_round
    all_replicated = req.all_replicated_index
    leader_commit = req.leader_committed_index
    heartbeat = req.is_heartbeat
    transferee = req.transferee_uuid
    wire_entries = req.entries
    if not (
        req.tablet_id
        and caller
        and dest
        and caller != dest
        and (server_uuid is None or dest == server_uuid)
        and 1 <= term <= MAX_TERM
        and 0 <= prev_index <= MAX_INDEX - len(wire_entries)
        and 0 <= prev_term <= term
        and (prev_index == 0) == (prev_term == 0)
        and 0 <= commit <= MAX_INDEX
        and 0 <= read_round <= MAX_INDEX
        and 0 <= all_replicated <= MAX_INDEX
        and 0 <= leader_commit <= MAX_INDEX
        and transferee != caller
        and not (heartbeat and (wire_entries or prev_index))
    ):
        return _checked_update_request(req, server_uuid)
    entries: tuple[Entry, ...] = ()
    if wire_entries:
        decoded: list[Entry] = []
        index = prev_index
        least = prev_term or 1  # no entry has term 0, and none is older than prev_log_term
        kind_of = _FROM_PB.get
        for e in wire_entries:
            index += 1
            entry_term = e.term
            kind = kind_of(e.type)
            if (
                e.index != index
                or not least <= entry_term <= term
                or kind is None
                or kind is EntryType.CONFIG  # its payload is checked there
            ):
                return _checked_update_request(req, server_uuid)
            decoded.append(_new_entry(Entry, (entry_term, index, kind, e.payload)))
            least = entry_term
        entries = tuple(decoded)
    return Message(
        MessageType.HEARTBEAT if heartbeat else MessageType.APPEND,
        src=caller,
        dst=dest,
        term=term,
        log_term=prev_term,
        index=prev_index,
        entries=entries,
        commit=commit,
        context=read_round if heartbeat else 0,
        transferee=transferee or NO_NODE,
        all_replicated=all_replicated,
        leader_commit=leader_commit if heartbeat else 0,
    )


# Builds an Entry without the named tuple's Python-level __new__: every field is given.
_new_entry = tuple.__new__


def _checked_update_request(
    req: pb.UpdateConsensusRequest, server_uuid: str | None = None
) -> Message:
    """``message_from_update_request`` check by check, each failure in words."""
    _check_addressing(req.tablet_id, req.caller_uuid, req.dest_uuid, server_uuid, "UpdateConsensus")
    _check_term(req.caller_term, "UpdateConsensus: caller_term")
    _check_position(req.prev_log_index, req.prev_log_term, req.caller_term, "prev", "caller_term")
    _check_range(req.committed_index, MAX_INDEX, f"committed_index {req.committed_index}")
    _check_range(req.read_round, MAX_INDEX, f"read_round {req.read_round}")
    _check_range(
        req.all_replicated_index, MAX_INDEX, f"all_replicated_index {req.all_replicated_index}"
    )
    _check_range(
        req.leader_committed_index,
        MAX_INDEX,
        f"leader_committed_index {req.leader_committed_index}",
    )
    if req.is_heartbeat and req.entries:
        raise MalformedRequest(f"a heartbeat carries no entries (got {len(req.entries)})")
    if req.is_heartbeat and (req.prev_log_index or req.prev_log_term):
        raise MalformedRequest("a heartbeat names no log position (prev_log_index/term)")
    if req.transferee_uuid == req.caller_uuid:
        raise MalformedRequest(f"leader {req.caller_uuid!r} announces a transfer to itself")
    if req.entries and req.prev_log_index + len(req.entries) > MAX_INDEX:
        raise MalformedRequest(f"entries after {req.prev_log_index} run past index {MAX_INDEX}")
    entries = entries_from_pb(req.entries, req.prev_log_index, req.prev_log_term, req.caller_term)
    return Message(
        MessageType.HEARTBEAT if req.is_heartbeat else MessageType.APPEND,
        src=req.caller_uuid,
        dst=req.dest_uuid,
        term=req.caller_term,
        log_term=req.prev_log_term,
        index=req.prev_log_index,
        entries=entries,
        commit=req.committed_index,
        context=req.read_round if req.is_heartbeat else 0,
        transferee=req.transferee_uuid or NO_NODE,
        all_replicated=req.all_replicated_index,
        leader_commit=req.leader_committed_index if req.is_heartbeat else 0,
    )


def message_from_vote_request(
    req: pb.RequestVoteRequest, server_uuid: str | None = None
) -> Message:
    _check_addressing(req.tablet_id, req.candidate_uuid, req.dest_uuid, server_uuid, "RequestVote")
    _check_term(req.candidate_term, "RequestVote: candidate_term")
    _check_position(
        req.last_log_index,
        req.last_log_term,
        req.candidate_term,
        "last",
        "candidate_term",
        strict=True,
    )
    return Message(
        MessageType.PRE_VOTE if req.is_pre_vote else MessageType.VOTE,
        src=req.candidate_uuid,
        dst=req.dest_uuid,
        term=req.candidate_term,
        log_term=req.last_log_term,
        index=req.last_log_index,
        transfer=req.leader_transfer,
    )


def message_from_timeout_now_request(
    req: pb.TimeoutNowRequest, server_uuid: str | None = None
) -> Message:
    _check_addressing(req.tablet_id, req.caller_uuid, req.dest_uuid, server_uuid, "TimeoutNow")
    _check_term(req.caller_term, "TimeoutNow: caller_term")
    return Message(
        MessageType.TIMEOUT_NOW, src=req.caller_uuid, dst=req.dest_uuid, term=req.caller_term
    )


def _check_response(
    responder: str, error_set: bool, error: object, dst: str, what: str, numbers: Sequence[int]
) -> None:
    if any(not 0 <= n <= MAX_INDEX for n in numbers):  # MAX_TERM == MAX_INDEX
        raise MalformedResponse(f"{what} from {responder!r}: a term or index beyond int63")
    if error_set:
        raise MalformedResponse(f"{what} from {responder!r} reports an error: {error}")
    if not responder:
        raise MalformedResponse(f"{what}: responder_uuid is missing")
    if responder == dst:
        raise MalformedResponse(f"{what}: responder and caller are the same server {dst!r}")


def message_from_update_response(resp: pb.UpdateConsensusResponse, dst: str) -> Message:
    """APPEND_RESPONSE or HEARTBEAT_RESPONSE addressed to ``dst`` (the caller)."""
    responder = resp.responder_uuid
    term = resp.responder_term
    index = resp.last_log_index
    conflict_term = resp.conflict_term
    conflict_index = resp.conflict_index
    read_round = resp.read_round
    # The leader decodes one per follower per round: bare comparisons first, and the
    # check that says what is wrong only when one fails (the fields are unsigned).
    if (
        not responder
        or responder == dst
        or max(term, index, conflict_term, conflict_index, read_round) > MAX_INDEX
        or resp.HasField("error")
    ):
        numbers = (term, index, conflict_term, conflict_index, read_round)
        _check_response(
            responder, resp.HasField("error"), resp.error, dst, "UpdateConsensusResponse", numbers
        )
    heartbeat = resp.is_heartbeat
    return Message(
        MessageType.HEARTBEAT_RESPONSE if heartbeat else MessageType.APPEND_RESPONSE,
        src=responder,
        dst=dst,
        term=term,
        log_term=conflict_term,
        index=index,
        reject=resp.rejected,
        reject_hint=conflict_index,
        context=read_round if heartbeat else 0,
    )


def message_from_vote_response(resp: pb.RequestVoteResponse, dst: str) -> Message:
    _check_response(
        resp.responder_uuid,
        resp.HasField("error"),
        resp.error,
        dst,
        "RequestVoteResponse",
        (resp.responder_term,),
    )
    return Message(
        MessageType.PRE_VOTE_RESPONSE if resp.is_pre_vote else MessageType.VOTE_RESPONSE,
        src=resp.responder_uuid,
        dst=dst,
        term=resp.responder_term,
        reject=not resp.vote_granted,
    )


# What kinds of answer each request may get.  A HEARTBEAT may be answered by an
# APPEND_RESPONSE: that is how a follower tells a stale leader its newer term.
_ANSWERS = {
    MessageType.APPEND: frozenset({MessageType.APPEND_RESPONSE}),
    MessageType.HEARTBEAT: frozenset({MessageType.HEARTBEAT_RESPONSE, MessageType.APPEND_RESPONSE}),
    MessageType.VOTE: frozenset({MessageType.VOTE_RESPONSE}),
    MessageType.PRE_VOTE: frozenset({MessageType.PRE_VOTE_RESPONSE}),
}


def decode_response(
    request: Message, resp: pb.UpdateConsensusResponse | pb.RequestVoteResponse
) -> Message:
    """The core message a peer's answer to ``request`` stands for.

    Raises ``MalformedResponse`` when it cannot be stepped: the responder reported an error,
    it is not the server the request went to, or it is the wrong kind of answer (a pre-vote
    answer to a vote would let a candidate count the wrong election)."""
    if isinstance(resp, pb.UpdateConsensusResponse):
        answer = message_from_update_response(resp, request.src)
    else:
        answer = message_from_vote_response(resp, request.src)
    if answer.src != request.dst:
        raise MalformedResponse(
            f"answer to {request.type.value} for {request.dst!r} came from {answer.src!r}"
        )
    allowed = _ANSWERS.get(request.type, frozenset())
    if answer.type not in allowed:
        raise MalformedResponse(f"{answer.type.value} cannot answer {request.type.value}")
    return answer
