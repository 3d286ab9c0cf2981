"""Moving a tablet's replicas between servers: the client's side of membership changes
(``raftlet tablet add-replica / remove-replica / move-replica``, ``raftlet cluster
replace-server``).

The server side changes one thing at a time (``consensus.core.membership``): a replica is
created empty on its new server (CreateReplica), added to the group as a learner
(ChangeConfig), caught up by the leader with ordinary appends, then promoted to voter; a
replica leaves by ChangeConfig REMOVE on the leader (leadership is handed to another voter
first if it leads) and is then deleted from its server (DeleteReplica, a tombstone). Every
step waits for the previous one to commit, since the leader refuses a change while one is
pending.  Errors an operator can act on are ``InvalidArgument`` with the reason (unknown
tablet or server, a change in progress, a target that holds a replica already, no server
left to move to), and ``ReplicaNotDeleted`` when a replica left its group but its server
said it could not remove its files; the rest are the client's usual errors. A server that
is down when its replica is removed is no error: the group no longer needs it, and
``raftlet cluster status`` lists the leftover until a rerun deletes it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import grpc

from raftlet.client.client import Client
from raftlet.client.errors import InvalidArgument, RaftletError, RemoteError, Timeout
from raftlet.client.retry import CREDENTIALS_REFUSED, certificate_unverified
from raftlet.proto import admin_pb2, admin_pb2_grpc, consensus_pb2, tablet_pb2

__all__ = [
    "ReplicaNotDeleted",
    "TabletMembership",
    "UnknownServer",
    "add_replica",
    "leader_membership",
    "lost_majority",
    "move_replica",
    "remove_replica",
    "replace_server",
]

# How often a wait re-reads the state it waits for.
_POLL_S = 0.1
# How long a voter has to answer whether it runs, before leadership is handed to one.
_PROBE_S = 2.0
# With no leader for this long, a wait asks the servers whether the group lost its majority
# (then no leader can come, and waiting out the timeout only hides why); a few election
# timeouts, so an election under way is not mistaken for it.
_LEADERLESS_CHECK_S = 2.0
# A learner's server that has not answered for this long is taken for down, and a wait for
# it to catch up ends saying so (it waited out its whole timeout, silent, while `cluster
# status` said at once that the server was down: review r30a). Longer than a restart.
_SILENT_LEARNER_S = 15.0


@dataclass(frozen=True, slots=True)
class TabletMembership:
    """A tablet's group as its leader sees it."""

    tablet_id: str
    leader: str
    term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    commit_index: int
    config_index: int

    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @property
    def change_pending(self) -> bool:
        return self.config_index > self.commit_index


def _pause(deadline: float, what: str) -> None:
    if time.monotonic() >= deadline:
        raise Timeout(f"timed out waiting for {what}")
    threading.Event().wait(_POLL_S)


def _state(
    client: Client, server: str, tablet_id: str, timeout_s: float
) -> consensus_pb2.ConsensusStatePB:
    request = consensus_pb2.GetConsensusStateRequest(tablet_id=tablet_id)
    response = client.admin_stub(server).GetConsensusStatus(request, timeout=timeout_s)
    return cast(consensus_pb2.GetConsensusStateResponse, response).state


# Answers no wait changes: the caller's credentials refused (a reader's or writer's
# certificate, say), or a request the server cannot take. So is a server certificate this
# client cannot verify (``retry.certificate_unverified``), though its status is UNAVAILABLE.
_NOT_WAITED_OUT = CREDENTIALS_REFUSED | {grpc.StatusCode.INVALID_ARGUMENT}


def _refused(e: grpc.RpcError, server: str, tablet_id: str) -> RemoteError | None:
    """The error for a refusal that polling again would only repeat; None for one that may
    pass (no leader yet, a server restarting). A reader's membership command polled its
    refusals for its whole timeout, then said "timed out waiting for a ready leader"."""
    if certificate_unverified(e.details() or ""):
        return RemoteError(
            f"this client could not verify {server}'s certificate (is its CA, --tls-ca, the "
            f"cluster's, and the certificate not expired?): {e.code().name}: {e.details()}"
        )
    if e.code() not in _NOT_WAITED_OUT:
        return None
    return RemoteError(
        f"{server} refused to show {tablet_id}'s Raft state: {e.code().name}: {e.details()}"
    )


def leader_membership(client: Client, tablet_id: str, timeout_s: float) -> TabletMembership:
    """The membership of ``tablet_id`` from its ready leader (waiting up to ``timeout_s``
    for one)."""
    client.replicas(tablet_id)  # TabletNotFound for an unknown tablet
    deadline = time.monotonic() + timeout_s
    check_at = time.monotonic() + _LEADERLESS_CHECK_S
    while True:
        leader = client.leader_of(tablet_id, refresh=True)
        if leader is not None:
            try:
                st = _state(client, leader, tablet_id, min(5.0, timeout_s))
            except grpc.RpcError as e:
                if (refusal := _refused(e, leader, tablet_id)) is not None:
                    raise refusal from None
                st = None
            if st is not None and st.role == consensus_pb2.LEADER and st.leader_ready:
                return TabletMembership(
                    tablet_id,
                    leader,
                    st.current_term,
                    tuple(st.voters),
                    tuple(st.learners),
                    st.commit_index,
                    st.config_index,
                )
        if time.monotonic() >= check_at:
            check_at = time.monotonic() + _LEADERLESS_CHECK_S
            lost = lost_majority(client, tablet_id)
            if lost:
                raise RemoteError(lost)
        if time.monotonic() >= deadline:
            # Said only at the end: a voter that does not answer may be restarting.
            raise Timeout(
                f"timed out waiting for a ready leader of {tablet_id}"
                + _silent_voters(client, tablet_id)
            )
        _pause(deadline, f"a ready leader of {tablet_id}")


def _silent_voters(client: Client, tablet_id: str) -> str:
    """Why the wait for a leader may have failed, as the end of its message: the voters
    whose servers did not answer now, if a majority; "" otherwise (or if it cannot tell)."""
    group = _group_seen(client, tablet_id)
    if group is None:
        return ""
    voters, answered, _ = group
    silent = sorted(set(voters) - answered)
    if not voters or 2 * len(silent) < len(voters):
        return ""
    return (
        f": {len(silent)} of its {len(voters)} voters do not answer ({', '.join(silent)}), "
        "and a group elects a leader only with a majority of its voters -- start them again "
        "(`raftlet cluster status` shows which servers are down); no membership change can "
        "work without a leader"
    )


def _group_seen(
    client: Client, tablet_id: str
) -> tuple[tuple[str, ...], set[str], dict[str, str]] | None:
    """``tablet_id``'s voters as its running replicas report them (else the replicas the
    client knows of), the servers that answered, and the FAILED replicas' reasons; None if
    nothing can be asked."""
    try:
        answers = client.list_tablets(timeout_s=3.0)
    except RaftletError:
        return None
    failed: dict[str, str] = {}
    reported: dict[tuple[str, ...], int] = {}
    for uuid, answer in answers.items():
        for t in answer.tablets:
            if t.tablet_id != tablet_id:
                continue
            if t.state == tablet_pb2.TABLET_STATE_FAILED and t.role == consensus_pb2.ROLE_UNKNOWN:
                failed[uuid] = t.failure_reason
            elif t.voters:
                reported[tuple(t.voters)] = max(reported.get(tuple(t.voters), 0), t.term)
    if reported:
        voters = max(reported, key=lambda v: reported[v])
    else:
        try:
            voters = tuple(client.replicas(tablet_id))
        except RaftletError:
            return None
    return voters, set(answers), failed


def lost_majority(client: Client, tablet_id: str) -> str:
    """Why ``tablet_id`` can have no leader, or "": a majority of its voters is FAILED
    without consensus (a replica that failed to open never votes, and only a leader could
    repair it by a copy). The voters are those its running replicas report, else the
    replicas the client knows of; a server that does not answer counts for nothing."""
    group = _group_seen(client, tablet_id)
    if group is None:
        return ""
    voters, _, failed = group
    down = sorted(set(voters) & set(failed))
    if not voters or 2 * len(down) < len(voters):
        return ""
    return (
        f"{tablet_id} has lost a majority of its replicas: {len(down)} of its {len(voters)} "
        f"voters are FAILED ({'; '.join(f'{s}: {failed[s]}' for s in down)}), so it has no "
        "leader and cannot elect one, and no membership change (add-replica, "
        "remove-replica, move-replica, replace-server) can work without a leader. Restore "
        "the FAILED replicas' files (fix what each reason says -- permissions, a full or "
        "failed disk -- and restart their servers): once a majority opens again it elects a "
        "leader, which repairs the rest by a tablet copy. Files lost for good: `raftlet "
        "tablet export` reads a surviving replica's rows from its stopped server "
        '(docs/ARCHITECTURE.md, "A tablet that lost a majority")'
    )


def _membership_by(client: Client, tablet_id: str, deadline: float) -> TabletMembership:
    """``leader_membership`` within what is left until ``deadline`` (a moment at least)."""
    return leader_membership(client, tablet_id, max(0.1, deadline - time.monotonic()))


def _change_request(tablet_id: str, kind: int, server: str) -> admin_pb2.ChangeConfigRequest:
    return admin_pb2.ChangeConfigRequest(tablet_id=tablet_id, type=kind, server_uuid=server)  # type: ignore[arg-type]


def _change(
    client: Client,
    tablet_id: str,
    kind: int,
    server: str,
    timeout_s: float,
    cas_config_index: int | None = None,
) -> admin_pb2.ChangeConfigResponse:
    request = _change_request(tablet_id, kind, server)
    if cas_config_index is not None:
        request.cas_config_index = cas_config_index
    response, _ = client.on_leader(
        tablet_id,
        lambda stub, timeout: stub.ChangeConfig(request, timeout=timeout),
        what=f"membership change of tablet {tablet_id}",
        timeout_s=timeout_s,
    )
    return cast(admin_pb2.ChangeConfigResponse, response)


def _check_change(client: Client, tablet_id: str, kind: int, server: str, timeout_s: float) -> None:
    """Raise the refusal the leader would give the change now (``RemoteError``), changing
    nothing; a leader too old to say (no CheckConfigChange) lets it through unchecked."""
    request = _change_request(tablet_id, kind, server)

    def check(
        stub: admin_pb2_grpc.AdminServiceStub, timeout: float
    ) -> admin_pb2.ChangeConfigResponse | None:
        try:
            return cast(
                admin_pb2.ChangeConfigResponse, stub.CheckConfigChange(request, timeout=timeout)
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    client.on_leader(
        tablet_id, check, what=f"membership change of tablet {tablet_id}", timeout_s=timeout_s
    )


def _wait_committed(
    client: Client,
    tablet_id: str,
    index: int,
    deadline: float,
    took_effect: Callable[[TabletMembership], bool],
    change: str,
) -> TabletMembership:
    """Wait until the leader (whoever it is by then) has committed ``index``, the entry of
    ``change``, and return the membership then -- which ``took_effect`` must accept: a
    leader that lost its leadership before the change committed may see its entry
    replaced by the next leader's at the same index, and a commit index past it then says
    nothing of the change. A removal trusted that and force-deleted a replica that was
    still a voter (the new leader's, once). ``RemoteError`` when the change was lost."""
    while True:
        m = _membership_by(client, tablet_id, deadline)
        if m.commit_index >= index:
            if took_effect(m):
                return m
            raise RemoteError(
                f"{change} of {tablet_id} (entry {index}) did not hold: its leader lost the "
                "leadership before it committed, or another operator's change undid it; the "
                f"group is now voters {', '.join(m.voters)}"
                + (f", learners {', '.join(m.learners)}" if m.learners else "")
                + "; nothing else was done, run it again if it is still wanted"
            )
        _pause(deadline, f"entry {index} of {tablet_id} to commit")


def _wait_caught_up(client: Client, tablet_id: str, server: str, deadline: float) -> None:
    """Wait until ``server``'s replica holds every entry its leader had committed when the
    wait began (then promoting it costs the group no availability). Another operator may
    act meanwhile: ``RemoteError`` at once if ``server`` left the group, and a replica
    deleted while ``server`` is still a learner (a leftover deletion that raced this add)
    is made again -- unless its server holds one after all (a tablet copy was being
    installed in it, which answers as no replica for a moment): then the wait goes on."""
    target = _membership_by(client, tablet_id, deadline)
    answered = time.monotonic()
    while True:
        try:
            st = _state(client, server, tablet_id, 5.0)
            answered = time.monotonic()
            if st.last_log_index >= target.commit_index and st.applied_index >= target.commit_index:
                return
        except grpc.RpcError as e:
            if (refusal := _refused(e, server, tablet_id)) is not None:
                raise refusal from None
            silent = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            if silent and time.monotonic() - answered >= _SILENT_LEARNER_S:
                address = client.servers()[server].rpc_addr
                raise RemoteError(
                    f"{server} ({address}) has not answered for {_SILENT_LEARNER_S:g} s "
                    f"({e.code().name}: {e.details()}) -- is it down? It stays a learner of "
                    f"{tablet_id}: once it runs, `raftlet tablet add-replica {tablet_id} "
                    f"{server} --wait` finishes the add; `raftlet tablet remove-replica "
                    f"{tablet_id} {server}` undoes it"
                ) from None
            if e.code() == grpc.StatusCode.NOT_FOUND:
                m = _membership_by(client, tablet_id, deadline)
                if server not in m.learners:
                    raise RemoteError(
                        f"{server} left {tablet_id}'s group while it was being added (another "
                        f"operator's change?): voters {', '.join(m.voters)}"
                        + (f", learners {', '.join(m.learners)}" if m.learners else "")
                    ) from None
                # A learner with a replica after all: its leader catches it up.
                with contextlib.suppress(_AlreadyHeld):
                    _create_replica(
                        client, tablet_id, server, m, max(0.1, deadline - time.monotonic())
                    )
        _pause(
            deadline,
            f"the replica of {tablet_id} on {server} to catch up ({server} stays a learner "
            f"of {tablet_id}: `raftlet tablet add-replica {tablet_id} {server} --wait` "
            f"finishes the add, `raftlet tablet remove-replica {tablet_id} {server}` undoes "
            "it)",
        )


class _AlreadyHeld(InvalidArgument):
    """CreateReplica refused: the server holds a replica of the tablet already, or one is
    being installed there by a tablet copy."""


# How a server says it holds a replica already (``TabletServer.create_replica``).
_HELD = ("already holds a replica", "holds a replica's files already", "being installed")


def _create_replica(
    client: Client, tablet_id: str, server: str, m: TabletMembership, timeout_s: float
) -> None:
    """CreateReplica on ``server``, joining ``m`` as a learner; ``InvalidArgument`` why not
    (``_AlreadyHeld`` when the server holds one)."""
    learners = m.learners if server in m.learners else (*m.learners, server)
    request = admin_pb2.CreateReplicaRequest(
        tablet_id=tablet_id, voters=m.voters, learners=learners
    )
    try:
        # Waiting for the connection: a server just restarted may still be in its channel's
        # reconnect backoff (the add then failed "connection refused").
        client.admin_stub(server).CreateReplica(
            request, timeout=min(10.0, timeout_s), wait_for_ready=True
        )
    except grpc.RpcError as e:
        hint = ""
        if "already holds a replica" in (e.details() or ""):
            hint = (
                f" (a leftover of an earlier removal: `raftlet tablet remove-replica "
                f"{tablet_id} {server}` deletes it)"
            )
            with contextlib.suppress(RaftletError):
                if server in leader_membership(client, tablet_id, 5.0).members():
                    # Another operator's add made it a member meanwhile: removing it, as
                    # the hint said, would leave the tablet a voter short.
                    hint = (
                        f" ({server} joined {tablet_id}'s group meanwhile: another operator's "
                        "add or move? `raftlet cluster status` shows the group)"
                    )
        error = _AlreadyHeld if any(h in (e.details() or "") for h in _HELD) else InvalidArgument
        raise error(
            f"creating a replica of {tablet_id} on {server} failed: "
            f"{_said(client, server, e)}{hint}"
        ) from None


def _said(client: Client, server: str, e: grpc.RpcError) -> str:
    """What a failed call to ``server`` says: a server that does not answer is called so,
    with its address (gRPC's own words were a bare "Deadline Exceeded")."""
    code = e.code()
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
        address = client.servers()[server].rpc_addr
        return (
            f"{server} ({address}) is not answering ({code.name}: {e.details()}) -- is it "
            "down? Start it, or pick another server"
        )
    return f"{e.details()}"


def _live_voter(client: Client, tablet_id: str, voters: list[str]) -> str:
    """The one of ``voters`` to hand leadership to: of those that answer, the one with the
    longest log. The first in order was asked even when it was down: the leader then
    handed its term to a dead server, refused writes meanwhile, and the command waited
    out its timeout."""
    answered: list[tuple[int, str]] = []
    for voter in voters:
        try:
            state = _state(client, voter, tablet_id, _PROBE_S)
        except grpc.RpcError:
            continue
        answered.append((state.last_log_index, voter))
    if not answered:
        raise InvalidArgument(
            f"no other voter of {tablet_id} answers ({', '.join(voters)}): none can take "
            "its leadership; start them first"
        )
    return max(answered)[1]


def _refuse_if_pending(m: TabletMembership, tablet_id: str) -> None:
    """One membership change at a time: the group's last one must be committed first."""
    if m.change_pending:
        raise InvalidArgument(
            f"a membership change of {tablet_id} is in progress (entry {m.config_index} is "
            "not committed yet); try again once it is"
        )


class UnknownServer(InvalidArgument):
    """A server the cluster config the servers run does not list."""


def _check_server(client: Client, server: str) -> None:
    servers = client.servers()
    if server not in servers:
        raise UnknownServer(
            f"unknown server {server!r}: the cluster config the servers run lists "
            f"{', '.join(sorted(servers))} (a server added to cluster.toml is known once the "
            "servers run that file: restart them on it)"
        )


def add_replica(
    client: Client,
    tablet_id: str,
    server: str,
    *,
    wait: bool = True,
    timeout_s: float = 120.0,
    say: Callable[[str], None] = lambda _: None,
) -> TabletMembership:
    """Add a replica of ``tablet_id`` on ``server``: create it empty there, add it as a
    learner, and with ``wait`` wait until it caught up and promote it to voter (waiting for
    that to commit).  A server that is a learner already is caught up and promoted."""
    _check_server(client, server)
    deadline = time.monotonic() + timeout_s
    m = leader_membership(client, tablet_id, timeout_s)
    if server in m.voters:
        raise InvalidArgument(f"{server} already holds a replica of {tablet_id} (a voter)")
    if server not in m.learners:
        _refuse_if_pending(m, tablet_id)
        _create_replica(client, tablet_id, server, m, timeout_s)
        try:
            added = _change(
                client, tablet_id, admin_pb2.CONFIG_CHANGE_ADD_LEARNER, server, timeout_s
            )
        except RaftletError as e:
            # Another operator's change came first: the replica just made must not stay
            # behind as one of no group.
            _undo_create(client, tablet_id, server, e)
            raise
        say(f"{tablet_id}: {server} added as a learner (entry {added.index})")
        m = _wait_committed(
            client,
            tablet_id,
            added.index,
            deadline,
            lambda m: server in m.members(),
            f"adding {server} as a learner",
        )
    if not wait:
        return m
    _wait_caught_up(client, tablet_id, server, deadline)

    def promotion_committed(index: int) -> TabletMembership:
        return _wait_committed(
            client,
            tablet_id,
            index,
            deadline,
            lambda m: server in m.voters,
            f"promoting {server} to voter",
        )

    try:
        promoted = _change(client, tablet_id, admin_pb2.CONFIG_CHANGE_PROMOTE, server, timeout_s)
    except RemoteError:
        # Promoted already (the same add, run twice at once): what was asked is done, once
        # that promotion commits.
        m = _membership_by(client, tablet_id, deadline)
        if server not in m.voters:
            raise
        if m.change_pending:
            m = promotion_committed(m.config_index)
        say(f"{tablet_id}: {server} is a voter already")
        return m
    m = promotion_committed(promoted.index)
    say(f"{tablet_id}: {server} caught up and promoted to voter (entry {promoted.index})")
    return m


class ReplicaNotDeleted(RemoteError):
    """A replica left its group, but its server answered that it could not remove its
    files (an immutable file, a read-only mount): listed FAILED there until the file is
    fixed and ``remove-replica`` runs again. ``membership``: the group without it."""

    def __init__(self, message: str, membership: TabletMembership) -> None:
        super().__init__(message)
        self.membership = membership


class _NotAMember(InvalidArgument):
    """The server to remove is no member of the group (another operator's change?)."""


class _TooFewLeft(RemoteError):
    """A move's removal would leave fewer voters than the move keeps (another change came
    first)."""


def remove_replica(
    client: Client,
    tablet_id: str,
    server: str,
    *,
    wait: bool = True,
    timeout_s: float = 120.0,
    say: Callable[[str], None] = lambda _: None,
    leftovers: bool = True,
    least_voters: int | None = None,
) -> TabletMembership:
    """Remove ``server``'s replica of ``tablet_id`` from the group (handing leadership to
    another voter first if it leads); with ``wait``, wait for the removal to commit and
    delete the replica from its server if that server answers. A server that is no member
    has its leftover replica deleted -- unless not ``leftovers`` (a move's own removal): then
    ``_NotAMember``, as when another operator removes it meanwhile. With ``least_voters``
    (a move's), refuse (``_TooFewLeft``) a removal that would leave fewer voters, judged on
    a membership the leader then changes only if no other change came first."""
    _check_server(client, server)
    deadline = time.monotonic() + timeout_s
    m = leader_membership(client, tablet_id, timeout_s)

    def gone() -> _NotAMember:
        return _NotAMember(f"{server} is no member of {tablet_id}'s group any more")

    if server not in m.members() and not leftovers:
        raise gone()
    if server not in m.members():
        # No member -- but its server may still run a replica left from a removal it never
        # heard of (it was down): delete that one, which is what is left to remove.
        try:
            # Waiting for the connection: a server just restarted may still be in its
            # channel's reconnect backoff.
            _delete_replica(client, tablet_id, server, min(10.0, timeout_s), wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise InvalidArgument(
                    f"{server} is no member of {tablet_id}'s group, and deleting a leftover "
                    f"replica there failed: {_said(client, server, e)}"
                ) from None
            raise InvalidArgument(
                f"{server} holds no replica of {tablet_id} (voters {', '.join(m.voters)}"
                + (f"; learners {', '.join(m.learners)})" if m.learners else ")")
            ) from None
        after = _membership_by(client, tablet_id, deadline)
        if server in after.members():
            # A concurrent add made it a member meanwhile: what was deleted was its new
            # replica, which that add makes again (``_wait_caught_up``).
            raise RemoteError(
                f"{server} joined {tablet_id}'s group (another operator's add) while its "
                "replica there was being deleted as a leftover; that add makes the replica "
                f"again -- run `raftlet tablet remove-replica {tablet_id} {server}` once it "
                "is done if it should go"
            )
        say(f"{tablet_id}: the leftover replica on {server} (no member of the group) was deleted")
        return m
    _refuse_if_pending(m, tablet_id)
    cas = None
    if least_voters is not None:
        left = [v for v in m.voters if v != server]
        if len(left) < least_voters:
            raise _TooFewLeft(
                f"removing {server} would leave {tablet_id} {len(left)} voter(s) "
                f"({', '.join(left) or 'none'}), fewer than the {least_voters} this move keeps: "
                "another change ran meanwhile (another operator's move or removal?), so "
                f"{server} stays -- see `raftlet cluster status`"
            )
        cas = m.config_index
    if m.leader == server:
        others = [v for v in m.voters if v != server]
        if not others:
            raise InvalidArgument(f"{server} is the only voter of {tablet_id}")
        # Refused now, it would be refused after the hand-over too: move nothing for it.
        _check_change(client, tablet_id, admin_pb2.CONFIG_CHANGE_REMOVE, server, timeout_s)
        try:
            client.leader_step_down(
                tablet_id, new_leader=_live_voter(client, tablet_id, others), timeout_s=timeout_s
            )
        except RaftletError:
            # Another operator may have moved the leadership (or the server) meanwhile: a
            # refusal then says nothing about what is left to do.
            m = _membership_by(client, tablet_id, deadline)
            if m.leader == server:
                raise
        while m.leader == server:
            _pause(
                deadline,
                f"leadership of {tablet_id} to leave {server} (`raftlet leader-step-down "
                f"{tablet_id} --to SERVER` hands it to a voter that runs; then run this again)",
            )
            m = _membership_by(client, tablet_id, deadline)
        say(f"{tablet_id}: leadership moved from {server} to {m.leader}")
        if server not in m.members():
            if not leftovers:
                raise gone()
            raise InvalidArgument(f"{server} left {tablet_id}'s group meanwhile: nothing to do")
    try:
        removed = _change(client, tablet_id, admin_pb2.CONFIG_CHANGE_REMOVE, server, timeout_s, cas)
    except RemoteError:
        if not leftovers:
            after = _membership_by(client, tablet_id, deadline)
            if server not in after.members():
                raise gone() from None
        raise
    say(f"{tablet_id}: {server} removed (entry {removed.index})")
    if not wait:
        say(
            f"{tablet_id}: not waiting for the removal to commit, so the replica stays on "
            f"{server}; then `raftlet tablet remove-replica {tablet_id} {server}` deletes it"
        )
        # The group as the change makes it (not yet committed).
        return TabletMembership(
            tablet_id,
            m.leader,
            m.term,
            tuple(removed.voters),
            tuple(removed.learners),
            m.commit_index,
            removed.index,
        )
    m = _wait_committed(
        client,
        tablet_id,
        removed.index,
        deadline,
        lambda m: server not in m.members(),
        f"removing {server}",
    )
    try:
        # Committed: the replica is out of the group whether or not it heard of it.
        _delete_replica(client, tablet_id, server, 10.0)
        say(f"{tablet_id}: the replica on {server} was deleted")
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            say(f"{tablet_id}: {server} held no replica of it: nothing left to delete")
        elif e.code() == grpc.StatusCode.FAILED_PRECONDITION:
            # It answered, naming a file it could not remove: the operator must act.
            raise ReplicaNotDeleted(
                f"{server} left the group (voters {', '.join(m.voters)}), but {e.details()}",
                m,
            ) from None
        else:
            # Down, or not answering: the group no longer needs it, so this goes on (a
            # replace-server of a dead server must).
            say(
                f"{tablet_id}: the replica on {server} was not deleted ({e.code().name}: "
                f"{e.details()}); once {server} is up, `raftlet tablet remove-replica "
                f"{tablet_id} {server}` deletes it (`raftlet cluster status` lists it)"
            )
    return m


def _undo_create(client: Client, tablet_id: str, server: str, why: RaftletError) -> None:
    """Delete the replica ``add_replica`` made on ``server`` for a change that failed,
    unless ``server`` is a member after all (the change may have gone through)."""
    try:
        m = leader_membership(client, tablet_id, 10.0)
        if server not in m.members():
            _delete_replica(client, tablet_id, server, 10.0)
    except (RaftletError, grpc.RpcError) as e:
        raise RemoteError(
            f"adding {server} to {tablet_id} failed ({why}), and deleting the replica made "
            f"for it failed too ({e}): `raftlet tablet remove-replica {tablet_id} {server}` "
            "deletes it"
        ) from None


def _deleted_leftover(
    client: Client, tablet_id: str, server: str, timeout_s: float, say: Callable[[str], None]
) -> str | None:
    """Delete what ``server`` may still run of a group it left (removed while it was down, or
    a move stopped before its deletion): "" when it was deleted, None when there was none,
    else why it is not -- said, not raised, so the caller's other work goes on."""
    try:
        _delete_replica(client, tablet_id, server, timeout_s)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return None
        why = (
            f"deleting the leftover replica on {server} failed ({_said(client, server, e)}): "
            f"`raftlet tablet remove-replica {tablet_id} {server}` deletes it"
        )
        say(f"{tablet_id}: {why}")
        return why
    say(f"{tablet_id}: the leftover replica on {server} (no member of the group) was deleted")
    return ""


def _delete_replica(
    client: Client, tablet_id: str, server: str, timeout_s: float, *, wait_for_ready: bool = False
) -> None:
    """DeleteReplica with ``force`` on ``server``: its replica is no member of the group."""
    client.admin_stub(server).DeleteReplica(
        admin_pb2.DeleteReplicaRequest(tablet_id=tablet_id, force=True),
        timeout=timeout_s,
        wait_for_ready=wait_for_ready,
    )


def move_replica(
    client: Client,
    tablet_id: str,
    source: str,
    target: str,
    *,
    wait: bool = True,
    timeout_s: float = 120.0,
    say: Callable[[str], None] = lambda _: None,
) -> TabletMembership:
    """Move ``tablet_id``'s replica from ``source`` to ``target``: add ``target`` (caught up
    and promoted), then remove ``source``."""
    _check_server(client, source)
    _check_server(client, target)
    m = leader_membership(client, tablet_id, timeout_s)
    if source not in m.members():
        if target in m.voters:  # a rerun of a move that finished, but perhaps its deletion
            if _deleted_leftover(client, tablet_id, source, min(10.0, timeout_s), say) is None:
                # Nothing on the source either: a finished move run again, or a mistyped
                # FROM, which was reported as a move done (review r33a).
                say(
                    f"{tablet_id}: {target} is a voter and {source} holds no replica of it: "
                    f"nothing to move (moved already, or is {source} the wrong FROM?)"
                )
            else:
                say(f"{tablet_id}: {target} is a voter and {source} no member: moved already")
            return m
        raise InvalidArgument(f"{source} holds no replica of {tablet_id}")
    factor = client.replication_factor(client.table_of(tablet_id))

    def remove_source(least_voters: int) -> TabletMembership:
        return remove_replica(
            client,
            tablet_id,
            source,
            wait=wait,
            timeout_s=timeout_s,
            say=say,
            leftovers=False,
            least_voters=least_voters,
        )

    if target in m.voters:
        if len(m.voters) - (source in m.voters) < factor:
            raise InvalidArgument(f"{target} already holds a replica of {tablet_id}")
        # A move stopped after its add (interrupted, or its removal timed out), or an
        # add-replica: what is left of the move is the removal, and a rerun refused it.
        say(f"{tablet_id}: {target} is a voter already; removing {source}")
        return remove_source(factor)
    added = add_replica(client, tablet_id, target, wait=True, timeout_s=timeout_s, say=say)
    try:
        if source not in added.members():
            raise _NotAMember(source)
        try:
            # What the move keeps: two moves onto one server at once each removed a voter,
            # and left a tablet of three voters with one (review r30a).
            return remove_source(min(len(m.voters), factor))
        except (_NotAMember, ReplicaNotDeleted, _TooFewLeft):
            raise
        except RaftletError as e:
            raise e.with_message(
                f"{e} -- {target} is a voter of {tablet_id} and {source} not yet removed: run "
                f"the same `raftlet tablet move-replica {tablet_id} {source} {target}` again "
                "to finish the move (it removes the source if the tablet has a voter to spare "
                "by then: another operator's move may have taken it)"
            ) from e
    except _NotAMember:
        after = leader_membership(client, tablet_id, timeout_s)
        if target in after.voters and len(after.voters) <= factor:
            # Another operator made this very move meanwhile: ``target`` is wanted. Undoing
            # the add left the tablet a voter short (and said "nothing moved").
            say(f"{tablet_id}: {source} left the group meanwhile (another operator's move?)")
            return after
        # Another operator moved it elsewhere: adding ``target`` made one voter too many.
        say(f"{tablet_id}: {source} left the group meanwhile (another move?); undoing the add")
        remove_replica(client, tablet_id, target, wait=True, timeout_s=timeout_s, say=say)
        raise RemoteError(
            f"{source} left {tablet_id}'s group while {target} was being added (another "
            f"operator's move?), so {target} was removed again: nothing moved"
        ) from None


def replace_server(
    client: Client,
    server: str,
    *,
    timeout_s: float = 300.0,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, str]:
    """Move every replica on ``server`` (which may be dead) to a live server that holds no
    replica of its tablet, the least loaded first; returns tablet -> new server ("" for a
    replica only removed: its tablet keeps its table's replication factor without it).
    A tablet that can go nowhere is left for the end, the others moved first, and then
    reported (``InvalidArgument``)."""
    _check_server(client, server)
    answers = client.list_tablets(timeout_s=5.0)
    load = {uuid: len(answer.tablets) for uuid, answer in answers.items() if uuid != server}
    # Who runs a replica of each tablet, member or not: a server holding a leftover of an
    # earlier removal cannot take a new one (CreateReplica refuses it).
    hosts: dict[str, set[str]] = {}
    for uuid, answer in answers.items():
        for t in answer.tablets:
            hosts.setdefault(t.tablet_id, set()).add(uuid)
    moved: dict[str, str] = {}
    stuck: list[str] = []
    undeleted: list[str] = []  # moved, but the server could not remove the old files
    for table in client.tables():
        factor = client.replication_factor(table)
        for tablet_id in client.tablets(table):
            m = leader_membership(client, tablet_id, timeout_s)
            if server not in m.members():
                if server in hosts.get(tablet_id, ()):
                    # A leftover: removed while it was down, or a run stopped between the
                    # removal and the deletion. A rerun said "no replicas" and left it; one
                    # that cannot be deleted is named at the end, the others still move.
                    why = _deleted_leftover(client, tablet_id, server, min(10.0, timeout_s), say)
                    if why:
                        undeleted.append(f"{tablet_id}: {why}")
                    else:
                        moved[tablet_id] = ""
                continue
            if server in m.learners or len(m.voters) > factor:
                # One replica more than the table asks for: dropping it is the move.
                try:
                    remove_replica(client, tablet_id, server, timeout_s=timeout_s, say=say)
                except ReplicaNotDeleted as e:
                    undeleted.append(f"{tablet_id}: {e}")
                moved[tablet_id] = ""
                continue
            # A learner an earlier run added and did not promote (it timed out, or was
            # stopped) is the target: another would leave that learner behind for good.
            unfinished = [uuid for uuid in m.learners if uuid in load]
            held = hosts.get(tablet_id, set())
            candidates = sorted(
                (n, uuid)
                for uuid, n in load.items()
                if uuid not in m.members() and uuid not in held
            )
            if not candidates and not unfinished:
                stuck.append(tablet_id)
                say(f"{tablet_id}: no live server to move it to; left on {server} for now")
                continue
            target = unfinished[0] if unfinished else candidates[0][1]
            try:
                move_replica(client, tablet_id, server, target, timeout_s=timeout_s, say=say)
            except ReplicaNotDeleted as e:  # moved: the rest can go on
                undeleted.append(f"{tablet_id}: {e}")
            load[target] += 1
            moved[tablet_id] = target
    done = f" (moved: {', '.join(sorted(moved))})" if moved else ""
    if stuck:
        left = f"; and {'; '.join(undeleted)}" if undeleted else ""
        raise InvalidArgument(
            f"no live server to move {', '.join(stuck)} to: every live server "
            f"({', '.join(sorted(load)) or 'none'}) holds a replica of it already (a member, "
            f"or a leftover that `raftlet tablet remove-replica TABLET SERVER` deletes)"
            f"{done}{left}"
        )
    if undeleted:
        raise RemoteError(f"{'; '.join(undeleted)}{done}")
    return moved
