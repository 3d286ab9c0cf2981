"""consensus/rpc/codec.py: core Messages to and from the ConsensusService protos.

Every message type the core sends round-trips exactly through its proto *and its bytes*;
whatever a peer can put on the wire either decodes to a Message or is refused with a
ValueError that says why -- never another exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from raftlet.consensus.rpc.codec import (
    MalformedRequest,
    MalformedResponse,
    WrongServerUuid,
    _checked_update_request,
    decode_response,
    encode_request,
    message_from_timeout_now_request,
    message_from_update_request,
    message_from_update_response,
    message_from_vote_request,
    message_from_vote_response,
    update_request_from_message,
    update_response_from_message,
    vote_request_from_message,
    vote_response_from_message,
)
from raftlet.proto import common_pb2
from raftlet.proto import consensus_pb2 as pb

TABLET = "tablet-0001"
U64 = (1 << 64) - 1
I63 = (1 << 63) - 1
assert MAX_TERM == MAX_INDEX == I63

uuids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
# What a term or index may be on the wire: int63, though the fields are uint64.
u63 = st.integers(0, I63)
# A request's own term (a leader's or candidate's): at least 1.
terms = st.integers(1, I63)


@st.composite
def src_dst(draw: st.DrawFn) -> tuple[str, str]:
    src = draw(uuids)
    dst = draw(uuids.filter(lambda u: u != src))
    return src, dst


@st.composite
def log_position(draw: st.DrawFn, term: int, strict: bool = False) -> tuple[int, int]:
    """(index, term of that entry) as a sender at ``term`` could hold it (``strict``: a
    candidate, which holds no entry of the term it asks for)."""
    top = term - 1 if strict else term
    if top < 1:
        return 0, 0
    index = draw(u63)
    log_term = 0 if index == 0 else draw(st.integers(1, top))
    return index, log_term


@st.composite
def appends(draw: st.DrawFn, heartbeat: bool = False) -> Message:
    src, dst = draw(src_dst())
    term = draw(terms)
    prev_index, prev_term = (0, 0) if heartbeat else draw(log_position(term))
    entries: list[Entry] = []
    if not heartbeat and prev_index < I63 - 8:
        count = draw(st.integers(0, 6))
        entry_term = max(prev_term, 1)
        for i in range(count):
            entry_term = draw(st.integers(entry_term, min(term, entry_term + 2)))
            kind = draw(st.sampled_from(EntryType))
            # A CONFIG entry carries a membership; the codec refuses anything else there.
            data = (
                Membership(("a", "b"), tuple(draw(st.sampled_from([[], ["c"]])))).encode()
                if kind is EntryType.CONFIG
                else draw(st.binary(max_size=40))
            )
            entries.append(Entry(term=entry_term, index=prev_index + 1 + i, type=kind, data=data))
    return Message(
        MessageType.HEARTBEAT if heartbeat else MessageType.APPEND,
        src,
        dst,
        term,
        log_term=prev_term,
        index=prev_index,
        entries=tuple(entries),
        commit=draw(u63),
        context=draw(u63) if heartbeat else 0,  # a heartbeat's read round
        transferee=draw(st.one_of(st.just(NO_NODE), uuids.filter(lambda u: u != src))),
        leader_commit=draw(u63) if heartbeat else 0,  # an append's commit is the leader's
    )


@st.composite
def votes(draw: st.DrawFn, pre_vote: bool) -> Message:
    src, dst = draw(src_dst())
    term = draw(terms)
    index, log_term = draw(log_position(term, strict=True))
    return Message(
        MessageType.PRE_VOTE if pre_vote else MessageType.VOTE,
        src,
        dst,
        term,
        log_term=log_term,
        index=index,
        transfer=draw(st.booleans()),
    )


@st.composite
def timeout_nows(draw: st.DrawFn) -> Message:
    src, dst = draw(src_dst())
    return Message(MessageType.TIMEOUT_NOW, src, dst, draw(terms))


@st.composite
def update_responses(draw: st.DrawFn, heartbeat: bool) -> Message:
    src, dst = draw(src_dst())
    return Message(
        MessageType.HEARTBEAT_RESPONSE if heartbeat else MessageType.APPEND_RESPONSE,
        src,
        dst,
        draw(u63),
        log_term=draw(u63),
        index=draw(u63),
        reject=draw(st.booleans()),
        reject_hint=draw(u63),
        context=draw(u63) if heartbeat else 0,
    )


@st.composite
def vote_responses(draw: st.DrawFn, pre_vote: bool) -> Message:
    src, dst = draw(src_dst())
    return Message(
        MessageType.PRE_VOTE_RESPONSE if pre_vote else MessageType.VOTE_RESPONSE,
        src,
        dst,
        draw(u63),
        reject=draw(st.booleans()),
    )


def _over_the_wire(proto: Any) -> Any:
    """The proto as the peer parses it: serialized and read back."""
    return type(proto).FromString(proto.SerializeToString())


def _decode_request(proto: Any, server_uuid: str) -> Message:
    if isinstance(proto, pb.UpdateConsensusRequest):
        return message_from_update_request(proto, server_uuid)
    if isinstance(proto, pb.RequestVoteRequest):
        return message_from_vote_request(proto, server_uuid)
    assert isinstance(proto, pb.TimeoutNowRequest)
    return message_from_timeout_now_request(proto, server_uuid)


_REQUEST_FOR = {
    MessageType.APPEND_RESPONSE: MessageType.APPEND,
    MessageType.HEARTBEAT_RESPONSE: MessageType.HEARTBEAT,
    MessageType.VOTE_RESPONSE: MessageType.VOTE,
    MessageType.PRE_VOTE_RESPONSE: MessageType.PRE_VOTE,
}


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    st.one_of(
        appends(),
        appends(heartbeat=True),
        votes(pre_vote=False),
        votes(pre_vote=True),
        timeout_nows(),
    )
)
def test_every_request_round_trips_exactly(m: Message) -> None:
    proto = _over_the_wire(encode_request(m, TABLET))
    assert proto.tablet_id == TABLET
    assert _decode_request(proto, server_uuid=m.dst) == m


@settings(max_examples=300)
@given(
    st.one_of(
        update_responses(heartbeat=False),
        update_responses(heartbeat=True),
        vote_responses(pre_vote=False),
        vote_responses(pre_vote=True),
    )
)
def test_every_response_round_trips_exactly(m: Message) -> None:
    if m.type in (MessageType.APPEND_RESPONSE, MessageType.HEARTBEAT_RESPONSE):
        proto = _over_the_wire(update_response_from_message(m))
    else:
        proto = _over_the_wire(vote_response_from_message(m))
    request = Message(_REQUEST_FOR[m.type], m.dst, m.src, 1)
    assert decode_response(request, proto) == m


def test_field_mapping_follows_the_proto_names() -> None:
    entries = (Entry(3, 8, EntryType.NO_OP), Entry(3, 9, EntryType.NORMAL, b"row"))
    append = Message(
        MessageType.APPEND, "a", "b", 3, log_term=2, index=7, entries=entries, commit=6
    )
    req = update_request_from_message(append, TABLET)
    assert (req.caller_uuid, req.dest_uuid, req.caller_term) == ("a", "b", 3)
    assert (req.prev_log_index, req.prev_log_term, req.committed_index) == (7, 2, 6)
    assert not req.is_heartbeat
    assert [(e.term, e.index, e.type, e.payload) for e in req.entries] == [
        (3, 8, pb.NO_OP, b""),
        (3, 9, pb.NORMAL, b"row"),
    ]

    heartbeat = Message(MessageType.HEARTBEAT, "a", "b", 3, commit=5, leader_commit=9)
    hb = update_request_from_message(heartbeat, TABLET)
    assert hb.is_heartbeat
    assert (hb.committed_index, hb.leader_committed_index) == (5, 9)
    assert not hb.entries

    rejected = Message(
        MessageType.APPEND_RESPONSE, "b", "a", 3, log_term=1, index=7, reject=True, reject_hint=4
    )
    resp = update_response_from_message(rejected)
    assert (resp.responder_uuid, resp.responder_term, resp.rejected) == ("b", 3, True)
    assert (resp.last_log_index, resp.conflict_index, resp.conflict_term) == (7, 4, 1)
    assert not resp.is_heartbeat

    vote = Message(MessageType.VOTE, "a", "b", 4, log_term=3, index=9, transfer=True)
    vreq = vote_request_from_message(vote, TABLET)
    assert (vreq.candidate_uuid, vreq.candidate_term) == ("a", 4)
    assert (vreq.last_log_index, vreq.last_log_term) == (9, 3)
    assert vreq.leader_transfer
    assert not vreq.is_pre_vote

    granted = vote_response_from_message(Message(MessageType.PRE_VOTE_RESPONSE, "b", "a", 5))
    assert granted.vote_granted
    assert granted.is_pre_vote

    tn = encode_request(Message(MessageType.TIMEOUT_NOW, "a", "b", 4), TABLET)
    assert isinstance(tn, pb.TimeoutNowRequest)
    assert (tn.tablet_id, tn.caller_uuid, tn.dest_uuid, tn.caller_term) == (TABLET, "a", "b", 4)


# --- encoding refuses what the wire cannot carry ----------------------------------------------


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (Message(MessageType.APPEND, "a", "b", 1, reject=True), "reject"),
        (Message(MessageType.HEARTBEAT, "a", "b", 1, transfer=True), "transfer"),
        (Message(MessageType.HEARTBEAT, "a", "b", 1, entries=(Entry(1, 1),)), "no entries"),
        (Message(MessageType.APPEND_RESPONSE, "b", "a", 1, commit=3), "commit"),
        (Message(MessageType.VOTE, "a", "b", 1, reject_hint=2), "reject_hint"),
        (Message(MessageType.VOTE_RESPONSE, "b", "a", 1, index=2), "index"),
        (Message(MessageType.TIMEOUT_NOW, "a", "b", 1, commit=1), "commit"),
        (Message(MessageType.APPEND, "a", "b", -1), "outside"),
        (Message(MessageType.VOTE, "a", "b", 1 << 64), "outside"),
        (Message(MessageType.HEARTBEAT, "a", "b", I63 + 1), "outside"),
        (Message(MessageType.APPEND, "a", "b", 1, commit=I63 + 1), "outside"),
        (Message(MessageType.APPEND, "a", "b", 1, entries=(Entry(1, I63 + 1),)), "out of range"),
        (Message(MessageType.VOTE, "a", "b", 1, transferee="c"), "transferee"),
        (Message(MessageType.APPEND, "a", "b", 1, leader_commit=3), "leader_commit"),
        (Message(MessageType.VOTE, "a", "b", 1, leader_commit=3), "leader_commit"),
        (Message(MessageType.HEARTBEAT, "a", "b", 1, leader_commit=I63 + 1), "outside"),
    ],
)
def test_encoding_refuses_fields_the_wire_cannot_carry(message: Message, needle: str) -> None:
    encode: Any = encode_request
    if message.type is MessageType.APPEND_RESPONSE:
        encode = update_response_from_message
    elif message.type is MessageType.VOTE_RESPONSE:
        encode = vote_response_from_message
    args = (message,) if encode is not encode_request else (message, TABLET)
    with pytest.raises(ValueError, match=needle):
        encode(*args)


def test_a_response_is_not_a_request() -> None:
    with pytest.raises(ValueError, match="is a response"):
        encode_request(Message(MessageType.VOTE_RESPONSE, "b", "a", 1), TABLET)


# --- decoding refuses malformed requests ------------------------------------------------------


def _update(**fields: Any) -> pb.UpdateConsensusRequest:
    base: dict[str, Any] = {
        "tablet_id": TABLET,
        "caller_uuid": "a",
        "dest_uuid": "b",
        "caller_term": 5,
        "prev_log_index": 3,
        "prev_log_term": 2,
        "committed_index": 3,
    }
    base.update(fields)
    return pb.UpdateConsensusRequest(**base)


def _entry(index: int, term: int = 5, type_: int = pb.NORMAL) -> pb.EntryPB:
    return pb.EntryPB(term=term, index=index, type=type_, payload=b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (_update(tablet_id=""), "tablet_id is missing"),
        (_update(caller_uuid=""), "caller uuid is missing"),
        (_update(dest_uuid=""), "dest_uuid is missing"),
        (_update(caller_uuid="b"), "same server"),
        (_update(entries=[_entry(4, type_=pb.ENTRY_UNKNOWN)]), "unsupported type ENTRY_UNKNOWN"),
        (_update(entries=[_entry(4, type_=pb.CONFIG_CHANGE)]), "entry 4 holds no membership"),
        (_update(entries=[_entry(4, type_=77)]), "unsupported type 77"),
        (_update(entries=[_entry(4), _entry(6)]), "not contiguous: 4 then 6"),
        (_update(entries=[_entry(5)]), "not right after prev_log_index 3"),
        (_update(entries=[_entry(4, term=4), _entry(5, term=3)]), "term goes back"),
        (_update(entries=[_entry(4, term=1)]), "older than prev_log_term 2"),
        (_update(entries=[_entry(4, term=6)]), "newer than caller_term 5"),
        (_update(prev_log_index=0, prev_log_term=0, entries=[_entry(1, term=0)]), ">= 1"),
        (_update(is_heartbeat=True, entries=[_entry(4)]), "heartbeat carries no entries"),
        (_update(prev_log_index=0, prev_log_term=1), "index 0"),
        (_update(prev_log_term=9), "newer than caller_term"),
        # Terms and indexes: at least 1 for a request's own term, int63 at most, and a log
        # position names an entry or nothing.
        (_update(caller_term=0, prev_log_index=0, prev_log_term=0), "caller_term 0 is outside"),
        (_update(caller_term=U64), "caller_term 18446744073709551615 is outside"),
        (_update(caller_term=I63 + 1), "is outside"),
        (_update(prev_log_index=I63 + 1), "prev_log_index .* is outside"),
        (_update(committed_index=U64), "committed_index .* is outside"),
        (_update(is_heartbeat=True, prev_log_index=0, prev_log_term=0, read_round=U64), "read_"),
        (_update(entries=[_entry(4, term=U64)]), "term .* is outside"),
        (_update(prev_log_index=I63 - 1, prev_log_term=2, entries=[_entry(I63), _entry(I63 + 1)]),
         "run past index"),
        (_update(prev_log_index=5, prev_log_term=0), "given with term 0"),
        (_update(is_heartbeat=True), "heartbeat names no log position"),
        (_update(transferee_uuid="a"), "transfer to itself"),
    ],
)  # fmt: skip
def test_malformed_update_consensus_is_refused(
    request_: pb.UpdateConsensusRequest, needle: str
) -> None:
    with pytest.raises(MalformedRequest, match=needle) as info:
        message_from_update_request(request_, server_uuid="b")
    # What the service boundary maps to INVALID_ARGUMENT (tests/unit/test_rpc_dispatch.py).
    assert isinstance(info.value, ValueError)


_EDGE_TERMS = [0, 1, 2, 5, 6, I63, I63 + 1, U64]
_EDGE_INDEXES = [0, 1, 3, 4, I63 - 2, I63 - 1, I63, I63 + 1, U64]
_MEMBERSHIP = Membership(voters=("a", "b")).encode()


def _mostly(valid: Any, *others: Any) -> st.SearchStrategy[Any]:
    """``valid`` nine times in ten, else one of ``others``: most requests are then one or
    two edges away from valid, where a fast path and the full checks could part ways."""
    return st.sampled_from([valid] * 9 * len(others) + list(others))


@st.composite
def near_valid_updates(draw: st.DrawFn) -> pb.UpdateConsensusRequest:
    """UpdateConsensus requests one edge away from valid, or valid, in every field."""
    prev = draw(_mostly(3, *_EDGE_INDEXES))
    prev_term = draw(_mostly(2, *_EDGE_TERMS))
    caller_term = draw(_mostly(5, *_EDGE_TERMS))
    entries = []
    for k in range(draw(st.integers(0, 4))):
        kind = draw(_mostly(pb.NORMAL, pb.NO_OP, pb.CONFIG_CHANGE, 77))
        payload = draw(st.sampled_from([b"x", _MEMBERSHIP])) if kind == pb.CONFIG_CHANGE else b"x"
        entries.append(
            pb.EntryPB(
                term=draw(_mostly(min(max(prev_term, 1) + k, caller_term), *_EDGE_TERMS)),
                index=draw(_mostly(prev + 1 + k, prev + k, prev + 2 + k, 0)) % (U64 + 1),
                type=kind,  # type: ignore[arg-type]
                payload=payload,
            )
        )
    return pb.UpdateConsensusRequest(
        tablet_id=draw(_mostly(TABLET, "")),
        caller_uuid=draw(_mostly("a", "b", "")),
        dest_uuid=draw(_mostly("b", "a", "c", "")),
        caller_term=caller_term,
        prev_log_index=prev,
        prev_log_term=prev_term,
        committed_index=draw(_mostly(3, *_EDGE_INDEXES)),
        read_round=draw(_mostly(0, *_EDGE_INDEXES)),
        all_replicated_index=draw(_mostly(2, *_EDGE_INDEXES)),
        leader_committed_index=draw(_mostly(4, *_EDGE_INDEXES)),
        is_heartbeat=draw(_mostly(False, True)),
        transferee_uuid=draw(_mostly("", "a", "c")),
        entries=entries,
    )


@settings(max_examples=3000, deadline=None)
@given(near_valid_updates(), st.sampled_from([None, "b"]))
def test_update_request_fast_path_agrees_with_the_checks(
    request_: pb.UpdateConsensusRequest, server_uuid: str | None
) -> None:
    """The fast path of message_from_update_request accepts only what the check-by-check
    decoding accepts, and decodes it the same; whatever it refuses gets that one's words."""

    def outcome(decode: Any) -> object:
        try:
            return decode(request_, server_uuid)
        except ValueError as exc:
            return (type(exc), str(exc))

    assert outcome(message_from_update_request) == outcome(_checked_update_request)


def test_request_for_another_server_is_refused() -> None:
    with pytest.raises(WrongServerUuid, match="for server 'b', but this is 'c'") as info:
        message_from_update_request(_update(), server_uuid="c")
    assert isinstance(info.value, ValueError)
    assert (info.value.dest_uuid, info.value.server_uuid) == ("b", "c")
    with pytest.raises(WrongServerUuid):
        message_from_vote_request(
            pb.RequestVoteRequest(tablet_id=TABLET, candidate_uuid="a", dest_uuid="b"), "c"
        )
    with pytest.raises(WrongServerUuid):
        message_from_timeout_now_request(
            pb.TimeoutNowRequest(tablet_id=TABLET, caller_uuid="a", dest_uuid="b"), "c"
        )


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (pb.RequestVoteRequest(tablet_id=TABLET, dest_uuid="b"), "caller uuid is missing"),
        (pb.RequestVoteRequest(tablet_id=TABLET, candidate_uuid="a"), "dest_uuid is missing"),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=2,
                last_log_index=4, last_log_term=3,
            ),
            "newer than candidate_term",
        ),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=2,
                last_log_term=1,
            ),
            "index 0",
        ),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=3,
                last_log_index=4, last_log_term=3,
            ),
            "last_log_term 3 is not older than candidate_term 3",
        ),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=3,
                last_log_index=4,
            ),
            "given with term 0",
        ),
        (
            pb.RequestVoteRequest(tablet_id=TABLET, candidate_uuid="a", dest_uuid="b"),
            "candidate_term 0 is outside",
        ),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=U64,
            ),
            "is outside",
        ),
        (
            pb.RequestVoteRequest(
                tablet_id=TABLET, candidate_uuid="a", dest_uuid="b", candidate_term=3,
                last_log_index=U64, last_log_term=2,
            ),
            "last_log_index .* is outside",
        ),
    ],
)  # fmt: skip
def test_malformed_request_vote_is_refused(request_: pb.RequestVoteRequest, needle: str) -> None:
    with pytest.raises(MalformedRequest, match=needle):
        message_from_vote_request(request_, server_uuid="b")


def test_malformed_timeout_now_is_refused() -> None:
    with pytest.raises(MalformedRequest, match="tablet_id is missing"):
        message_from_timeout_now_request(pb.TimeoutNowRequest(caller_uuid="a", dest_uuid="b"))
    for term in (0, I63 + 1, U64):
        with pytest.raises(MalformedRequest, match=r"caller_term .* is outside"):
            message_from_timeout_now_request(
                pb.TimeoutNowRequest(
                    tablet_id=TABLET, caller_uuid="a", dest_uuid="b", caller_term=term
                )
            )


@pytest.mark.parametrize(
    "resp",
    [
        pb.UpdateConsensusResponse(responder_uuid="b", responder_term=U64),
        pb.UpdateConsensusResponse(responder_uuid="b", responder_term=1, last_log_index=I63 + 1),
        pb.UpdateConsensusResponse(responder_uuid="b", responder_term=1, conflict_term=U64),
        pb.UpdateConsensusResponse(responder_uuid="b", responder_term=1, conflict_index=U64),
        pb.RequestVoteResponse(responder_uuid="b", responder_term=I63 + 1),
    ],
)
def test_answers_beyond_int63_are_refused(resp: Any) -> None:
    kind = MessageType.VOTE if isinstance(resp, pb.RequestVoteResponse) else MessageType.APPEND
    with pytest.raises(MalformedResponse, match="beyond int63"):
        decode_response(Message(kind, "a", "b", 1), resp)


@st.composite
def near_valid_updates(draw: st.DrawFn) -> pb.UpdateConsensusRequest:
    """Requests that are mostly well formed, each field sometimes wrong: uniform garbage would
    almost never get past the first check, and the checks after it would go untested."""

    def sometimes(good: Any, bad: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.just(good), st.just(good), st.just(good), bad))

    term = draw(st.integers(0, 6))
    prev_index = draw(st.integers(0, 6))
    prev_term = sometimes(0 if prev_index == 0 else min(term, 1), st.integers(0, 7))
    entries = []
    entry_term = max(prev_term, 1)
    for i in range(draw(st.integers(0, 4))):
        entry_term = sometimes(min(entry_term + draw(st.integers(0, 1)), term), st.integers(0, 7))
        entries.append(
            pb.EntryPB(
                term=entry_term,
                index=sometimes(prev_index + 1 + i, st.integers(0, 12)),
                type=sometimes(pb.NORMAL, st.sampled_from([pb.NO_OP, 0, 3, 9])),
                payload=draw(st.binary(max_size=4)),
            )
        )
    return pb.UpdateConsensusRequest(
        tablet_id=sometimes(TABLET, st.just("")),
        caller_uuid=sometimes("a", st.sampled_from(["", "b", "zz"])),
        dest_uuid=sometimes("b", st.sampled_from(["", "a", "c"])),
        caller_term=term,
        prev_log_index=prev_index,
        prev_log_term=prev_term,
        entries=entries,
        committed_index=draw(st.integers(0, 8)),
        is_heartbeat=sometimes(not entries and draw(st.booleans()), st.just(True)),
    )


@settings(max_examples=500)
@given(near_valid_updates())
def test_any_update_consensus_decodes_or_is_refused_with_value_error(
    req: pb.UpdateConsensusRequest,
) -> None:
    reason = ""
    try:
        m = message_from_update_request(_over_the_wire(req), server_uuid="b")
    except ValueError as exc:
        reason = str(exc)
        assert reason, "a refusal must say why (it goes to the caller's logs)"
    if reason:
        return
    # Whatever is accepted is something the core could have sent: entries directly follow
    # prev, terms never go back and none is newer than the sender's term.
    assert all(e.index == m.index + 1 + i for i, e in enumerate(m.entries))
    terms = [m.log_term, *(e.term for e in m.entries)]
    assert terms == sorted(terms)
    assert terms[-1] <= m.term
    assert update_request_from_message(m, TABLET) == req


# --- decoding answers ---------------------------------------------------------------------


def test_answer_with_an_error_is_not_a_message() -> None:
    resp = pb.UpdateConsensusResponse(
        responder_uuid="b",
        responder_term=4,
        rejected=True,
        error=common_pb2.ServerErrorPB(code=common_pb2.ServerErrorPB.UNKNOWN, message="dropped"),
    )
    with pytest.raises(MalformedResponse, match="reports an error"):
        message_from_update_response(resp, dst="a")
    vresp = pb.RequestVoteResponse(
        responder_uuid="b", error=common_pb2.ServerErrorPB(message="stopping")
    )
    with pytest.raises(MalformedResponse, match="stopping"):
        message_from_vote_response(vresp, dst="a")


@pytest.mark.parametrize(
    ("request_type", "resp", "needle"),
    [
        (MessageType.APPEND, pb.UpdateConsensusResponse(), "responder_uuid is missing"),
        (MessageType.APPEND, pb.UpdateConsensusResponse(responder_uuid="a"), "same server"),
        (MessageType.APPEND, pb.UpdateConsensusResponse(responder_uuid="c"), "came from 'c'"),
        (
            MessageType.APPEND,
            pb.UpdateConsensusResponse(responder_uuid="b", is_heartbeat=True),
            "HEARTBEAT_RESPONSE cannot answer APPEND",
        ),
        (
            MessageType.VOTE,
            pb.RequestVoteResponse(responder_uuid="b", is_pre_vote=True),
            "PRE_VOTE_RESPONSE cannot answer VOTE",
        ),
        (
            MessageType.PRE_VOTE,
            pb.RequestVoteResponse(responder_uuid="b"),
            "VOTE_RESPONSE cannot answer PRE_VOTE",
        ),
        (
            MessageType.VOTE,
            pb.UpdateConsensusResponse(responder_uuid="b"),
            "APPEND_RESPONSE cannot answer VOTE",
        ),
    ],
)
def test_mismatched_answers_are_refused(request_type: MessageType, resp: Any, needle: str) -> None:
    with pytest.raises(MalformedResponse, match=needle):
        decode_response(Message(request_type, "a", "b", 1), resp)


def test_a_stale_heartbeat_may_be_answered_with_an_append_response() -> None:
    # The core answers a HEARTBEAT from a stale leader with an APPEND_RESPONSE in its term.
    answer = decode_response(
        Message(MessageType.HEARTBEAT, "a", "b", 1),
        pb.UpdateConsensusResponse(responder_uuid="b", responder_term=7),
    )
    assert answer == Message(MessageType.APPEND_RESPONSE, "b", "a", 7)
