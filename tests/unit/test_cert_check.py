"""A server's TLS files are checked before it serves (``tserver.cert_check``): with an
expired certificate, another server's, a client's, one its CA did not sign, or a key of
another certificate, a server started, said it was ready, and no peer or client could
talk to it -- or, with another server's, its votes were refused as forged."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

import pytest

from raftlet.cluster.identity import AccessRole
from raftlet.deploy.certs import CertError, ClientSpec, create_certs
from raftlet.tserver.cert_check import ExpiryWatch, FilesRefused, check_server_tls
from tests.tls_certs import issue
from tests.unit.tserver_settings_helpers import parse, write_config

DAY = datetime.timedelta(days=1)


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    create_certs(
        tmp_path, servers=["ts1", "ts2"], clients=[ClientSpec("app", AccessRole.WRITER)], days=90
    )
    return tmp_path


def _check(d: Path, cert: str, key: str, ca: str = "ca.crt", **kw: object) -> None:
    check_server_tls(str(d / cert), str(d / key), str(d / ca), "ts1", **kw)  # type: ignore[arg-type]


def test_a_servers_own_files_pass(certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    _check(certs, "server-ts1.crt", "server-ts1.key")
    assert not caplog.records


def test_a_key_other_users_may_read_is_warned_of(
    certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Review r27a: a 644 tokens file was warned of, a 644 private key was not.
    caplog.set_level(logging.WARNING)
    (certs / "server-ts1.key").chmod(0o440)  # a Kubernetes secret, for the pod's group
    _check(certs, "server-ts1.crt", "server-ts1.key")
    assert not caplog.records
    (certs / "server-ts1.key").chmod(0o644)
    _check(certs, "server-ts1.crt", "server-ts1.key")
    assert [r.getMessage() for r in caplog.records] == [
        f"--tls_key {certs / 'server-ts1.key'} is readable by every user (mode 644): anyone "
        "who reads it can pose as this server; chmod o-rwx it"
    ]


def test_files_that_cannot_work_are_refused_naming_the_file_and_the_fault(certs: Path) -> None:
    # FilesRefused: the server exits 2, which supervisors do not restart on (review r27c:
    # another server's certificate was restarted five times by systemd, for ever by compose).
    with pytest.raises(
        FilesRefused, match=r"server-ts2\.crt is not this server's .*raftlet://server/ts2"
    ):
        _check(certs, "server-ts2.crt", "server-ts2.key")
    with pytest.raises(FilesRefused, match=r"client-app\.crt is a client certificate"):
        _check(certs, "client-app.crt", "client-app.key")
    with pytest.raises(FilesRefused, match=r"--tls_key .*server-ts2\.key is not the key of"):
        _check(certs, "server-ts1.crt", "server-ts2.key")
    with pytest.raises(FilesRefused, match=r"--tls_ca .*holds no PEM certificate"):
        _check(certs, "server-ts1.crt", "server-ts1.key", ca="server-ts1.key")
    # A file not there (a secret not mounted yet, say) is worth a restart: exit 1.
    with pytest.raises(OSError, match=r"--tls_cert .*nowhere\.crt: No such file") as missing:
        _check(certs, "nowhere.crt", "server-ts1.key")
    assert not isinstance(missing.value, FilesRefused)


@pytest.mark.parametrize(("error", "status"), [(FilesRefused("x"), 2), (OSError("x"), 1)])
def test_files_that_cannot_work_stop_the_server_with_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, status: int
) -> None:
    from raftlet.tserver import main

    async def refused(_settings: object) -> None:
        raise error

    monkeypatch.setattr(main, "_serve", refused)
    umask = os.umask(0o022)  # run() sets the process's umask: this test's process
    try:
        # Not under SCHED_BATCH: the pytest process's children would inherit it.
        settings = parse(write_config(tmp_path), "--sched_batch=false")
        assert main.run(settings) == status
    finally:
        os.umask(umask)


def test_a_certificate_that_does_not_name_the_host_clients_dial_is_refused(certs: Path) -> None:
    """It started, said ready, and every client's host name check refused it."""
    crt, key, ca = (str(certs / n) for n in ("server-ts1.crt", "server-ts1.key", "ca.crt"))
    check_server_tls(crt, key, ca, "ts1", host="127.0.0.1")
    check_server_tls(crt, key, ca, "ts1", host="LOCALHOST")
    with pytest.raises(OSError, match=r"does not name ts1\.example, the host clients and peers"):
        check_server_tls(crt, key, ca, "ts1", host="ts1.example")
    with pytest.raises(OSError, match=r"does not name 10\.0\.0\.1"):
        check_server_tls(crt, key, ca, "ts1", host="10.0.0.1")


def test_a_certificate_another_ca_signed_is_refused(
    certs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = tmp_path_factory.mktemp("other-ca")
    create_certs(other, servers=["ts1"])
    with pytest.raises(OSError, match=r"was not signed by --tls_ca"):
        check_server_tls(
            str(other / "server-ts1.crt"),
            str(other / "server-ts1.key"),
            str(certs / "ca.crt"),
            "ts1",
        )
    # A bundle of both CAs (a cluster moving to a new one) takes either's certificates.
    bundle = other / "bundle.crt"
    bundle.write_bytes((certs / "ca.crt").read_bytes() + (other / "ca.crt").read_bytes())
    check_server_tls(
        str(other / "server-ts1.crt"), str(other / "server-ts1.key"), str(bundle), "ts1"
    )


def test_dates_are_checked_and_a_near_expiry_is_warned_of(
    certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    with pytest.raises(OSError, match=r"--tls_cert .*server-ts1\.crt expired on"):
        _check(certs, "server-ts1.crt", "server-ts1.key", now=now + 91 * DAY)
    with pytest.raises(OSError, match=r"--tls_ca .* is not valid before"):
        _check(certs, "server-ts1.crt", "server-ts1.key", now=now - DAY)
    caplog.set_level(logging.WARNING)
    _check(certs, "server-ts1.crt", "server-ts1.key", now=now + 80 * DAY)
    (record,) = caplog.records
    assert "server-ts1.crt expires on" in record.getMessage()
    assert "renew it before then" in record.getMessage()


def test_certs_create_refuses_a_ca_that_cannot_sign_working_certificates(
    certs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The CA was made for 90-day certificates: it lasts 450 days.
    with pytest.raises(CertError, match=r"a certificate of 1000 days would outlive its CA"):
        create_certs(certs, clients=[ClientSpec("late", AccessRole.READER)], days=1000)
    other = tmp_path_factory.mktemp("mismatch")
    create_certs(other)
    (other / "ca.key").write_bytes((certs / "ca.key").read_bytes())
    with pytest.raises(CertError, match=r"ca\.key is not the key of .*ca\.crt"):
        create_certs(other, servers=["ts1"])
    # A server's certificate where the CA's should be: no CA, whatever its key.
    (other / "ca.crt").write_bytes((certs / "server-ts1.crt").read_bytes())
    (other / "ca.key").write_bytes((certs / "server-ts1.key").read_bytes())
    with pytest.raises(CertError, match=r"ca\.crt is no CA certificate"):
        create_certs(other, servers=["ts1"])
    (other / "ca.crt").write_text("not a certificate")
    with pytest.raises(CertError, match=r"ca\.crt holds no PEM certificate"):
        create_certs(other, servers=["ts1"])


def _expired_client(d: Path) -> tuple[Path, Path]:
    """A client certificate of ``d``'s CA that expired yesterday."""
    cert_path, key_path = d / "old.crt", d / "old.key"
    issue(d, cert_path, key_path, name="old", valid=(-10 * DAY, -DAY))
    return cert_path, key_path


def test_a_client_whose_certificate_cannot_work_is_told_at_once(certs: Path) -> None:
    """It retried for its whole timeout, then said "Socket closed"."""
    from raftlet.client.errors import InvalidArgument
    from raftlet.client.tls import TlsOptions

    mismatched = TlsOptions(certs / "ca.crt", certs / "client-app.crt", certs / "server-ts1.key")
    with pytest.raises(InvalidArgument, match=r"server-ts1\.key does not go with certificate"):
        mismatched.credentials()
    cert, key = _expired_client(certs)
    with pytest.raises(InvalidArgument, match=r"old\.crt expired on .*the servers refuse it"):
        TlsOptions(certs / "ca.crt", cert, key).credentials()
    TlsOptions(certs / "ca.crt", certs / "client-app.crt", certs / "client-app.key").credentials()


def test_a_running_server_says_once_when_its_certificate_nears_and_passes_expiry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review r27a: a server that ran on past its certificate's expiry logged nothing while
    every new connection to it failed."""
    caplog.set_level(logging.WARNING)
    expires = datetime.datetime(2026, 12, 8, 6, 0, tzinfo=datetime.UTC)
    now = [expires - 3 * DAY]
    watch = ExpiryWatch(expires, clock=lambda: now[0])
    said: list[str] = []

    def check_at(moment: datetime.datetime) -> bool:
        now[0] = moment
        expired = watch.check()
        said.extend(f"{r.levelname} {r.getMessage()}" for r in caplog.records)
        caplog.clear()
        return expired

    assert not check_at(expires - 2 * DAY)
    assert not check_at(expires - DAY / 2)
    assert not check_at(expires - DAY / 4)
    assert check_at(expires)
    assert check_at(expires + DAY)  # the server hands over what it leads at every pass
    assert said == [
        "WARNING TLS certificate (or its CA) expires at 2026-12-08 06:00 UTC, in 12 hours: "
        "renew it and restart the server before then",
        "ERROR TLS certificate (or its CA) expired at 2026-12-08 06:00 UTC: clients and peers "
        "that connect anew refuse this server, which hands over the tablets it leads; renew "
        "it and restart the server",
    ]
