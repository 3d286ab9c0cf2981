"""The deployment files in deploy/ cannot drift from the code.

Every command line a unit, image or manifest runs goes through the real CLI parser
(``cli.main.build_parser``) and, for ``raftlet tserver``, is resolved against the cluster config
that deployment ships (``ServerSettings.from_args``): a renamed flag, an unknown server id or a
config the loader rejects fails here, not at 3 a.m. in ``systemctl status``. The places that
must agree across files are checked too: ports (config, listen flags, EXPOSE, containerPort,
probes), the data volume holding every data_dir, the uid of the image and the pod security
context, the Grafana queries and the metric catalogue.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from raftlet.cli.main import build_parser
from raftlet.cluster import (
    ClusterConfig,
    load_cluster_config,
    parse_cluster_config,
    parse_host_port,
)
from raftlet.metrics.catalogue import ALL_PROTOTYPES
from raftlet.metrics.export_prometheus import exposed_name
from raftlet.metrics.registry import MetricRegistry, MetricType
from raftlet.metrics.status_server import StatusServer
from raftlet.tserver.settings import ServerSettings
from raftlet.tserver.status_pages import register_tablet_pages

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONFIG_IN_CONTAINER = "/etc/raftlet/cluster.toml"


# --- helpers -------------------------------------------------------------------------------


def parse_raftlet(argv: list[str]) -> argparse.Namespace:
    """``raftlet ARGV`` through the real parser; a usage error fails the test, naming argv
    (argparse's own one-line message is in the captured stderr)."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"`raftlet {shlex.join(argv)}` is rejected by the CLI parser (exit {e.code})")


def resolve_tserver(argv: list[str], config: ClusterConfig) -> ServerSettings:
    """``raftlet tserver …`` parsed and resolved against ``config`` (as the server would)."""
    args = parse_raftlet(argv)
    assert args.command == "tserver", argv
    return ServerSettings.from_args(args, config)


def port(addr: str) -> int:
    return parse_host_port(addr)[1]


def status_pages() -> set[str]:
    """The HTTP paths a tablet server's status server answers (/healthz, /readyz, …)."""
    status = StatusServer(MetricRegistry())
    register_tablet_pages(status, "ts1", {})
    return set(status.pages())


def console_script(program: str) -> str:
    """The entry point of console script ``program`` (KeyError if pyproject has none)."""
    return str(PYPROJECT["project"]["scripts"][PurePosixPath(program).name])


def test_every_entrypoint_is_the_parser_tested_here() -> None:
    # The files below run `raftlet`; the parser checked is the one that script calls.
    assert console_script("raftlet") == "raftlet.cli.main:main"


# --- cluster configs -----------------------------------------------------------------------


SHIPPED_CONFIGS = sorted(DEPLOY.rglob("*.toml"))


def test_deploy_ships_configs() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in SHIPPED_CONFIGS}
    assert {"docker/cluster.toml", "systemd/cluster.toml", "examples/cluster.toml"} <= names


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_shipped_cluster_config_loads(path: Path) -> None:
    config = load_cluster_config(path)
    assert config.placements(), f"{path}: no tablets"
    # Each shipped deployment is a real replicated cluster, not a single-server toy.
    assert len(config.servers) >= 3


# --- systemd -------------------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file as {section: {key: [values]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: {line!r} before any section"
        assert not line.endswith("\\"), f"{path}: continuation lines are not expected"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


UNIT = DEPLOY / "systemd" / "raftlet-tserver@.service"
SYSTEMD_CONFIG = DEPLOY / "systemd" / "cluster.toml"


def test_systemd_unit_runs_every_server_of_its_config() -> None:
    service = read_unit(UNIT)["Service"]
    (exec_start,) = service["ExecStart"]
    program, *argv = shlex.split(exec_start)
    assert program == "/opt/raftlet/.venv/bin/raftlet"
    console_script(program)
    config = load_cluster_config(SYSTEMD_CONFIG)
    for server in config.servers:
        # %i is the instance name: raftlet-tserver@ts1 runs server ts1.
        instance_argv = [a.replace("%i", server.id) for a in argv]
        assert not any("%" in a for a in instance_argv), f"unexpected specifier in {argv}"
        settings = resolve_tserver(instance_argv, config)
        assert settings.server_id == server.id
        # The unit names the config path the README tells to copy systemd/cluster.toml to.
        assert parse_raftlet(instance_argv).config == CONFIG_IN_CONTAINER
        # The data dir is the unit's StateDirectory: created and owned by the service user,
        # and writable although ProtectSystem=strict makes the rest of / read-only.
        (state_dir,) = service["StateDirectory"]
        assert settings.data_dir == Path("/var/lib") / state_dir.replace("%i", server.id)


def test_systemd_unit_stops_gracefully_and_runs_confined() -> None:
    unit = read_unit(UNIT)
    service = unit["Service"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert service["Restart"] == ["on-failure"]
    # Exit 2 is a usage/config error (OneLineArgumentParser): restarting cannot fix it.
    assert service["RestartPreventExitStatus"] == ["2"]
    assert service["TimeoutStopSec"]
    assert service["LimitNOFILE"]
    assert service["User"] == ["raftlet"]
    sysusers = (DEPLOY / "systemd" / "raftlet.sysusers.conf").read_text()
    assert re.search(r"^u raftlet ", sysusers, re.MULTILINE), "the unit's user is not created"
    for hardening in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "CapabilityBoundingSet"):
        assert hardening in service, hardening
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


# --- Docker --------------------------------------------------------------------------------


DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions per stage: [(INSTRUCTION, arguments)], continuation
    lines joined, comments dropped."""
    stages: list[list[tuple[str, str]]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        assert stages, f"{path}: {instruction} before FROM"
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


def exec_form(args: str) -> list[str]:
    """An ENTRYPOINT/CMD in exec (JSON) form. Shell form would run /bin/sh as PID 1, which
    does not pass SIGTERM on to raftlet: the graceful shutdown would never happen."""
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    assert all(isinstance(v, str) for v in value), args
    return value


def instructions(stage: list[tuple[str, str]], name: str) -> list[str]:
    return [args for inst, args in stage if inst == name]


def test_dockerfile_entrypoint_and_cmd_parse() -> None:
    stages = dockerfile_stages(DOCKERFILE)
    final = stages[-1]
    assert instructions(final, "FROM") == ["python:3.11-slim"]
    (entrypoint,) = instructions(final, "ENTRYPOINT")
    program, *entry_args = exec_form(entrypoint)
    assert program == "raftlet"
    console_script(program)
    cmds = instructions(final, "CMD")
    argv = entry_args + (exec_form(cmds[-1]) if cmds else [])
    # No CMD: `docker run raftlet` is `raftlet` alone, which prints the help.
    args = parse_raftlet(argv)
    if not cmds:
        assert args.command is None
    assert instructions(final, "STOPSIGNAL") == ["SIGTERM"]


def test_dockerfile_runs_as_non_root_and_copies_every_package() -> None:
    stages = dockerfile_stages(DOCKERFILE)
    final = stages[-1]
    (user,) = instructions(final, "USER")
    assert user.split(":")[0] not in ("root", "0")
    # Every package pyproject builds is in the build context the image installs from.
    copied = {
        args.split()[0].rstrip("/") for stage in stages for args in instructions(stage, "COPY")
    }
    # The wheel's one package is raftlet/, whose links name the folders it is built from.
    namespace = REPO / "raftlet"
    packages = {"raftlet"} | {p.name for p in namespace.iterdir() if p.is_symlink()}
    assert packages <= copied, f"not copied into the image: {sorted(packages - copied)}"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= {
        a for stage in stages for args in instructions(stage, "COPY") for a in args.split()[:-1]
    }


def dockerfile_uid() -> int:
    text = " ".join(a for s in dockerfile_stages(DOCKERFILE) for a in instructions(s, "RUN"))
    m = re.search(r"useradd [^&]*--uid (\d+)", text)
    assert m, "the Dockerfile creates no user with a fixed uid"
    return int(m.group(1))


def dockerfile_exposed() -> set[int]:
    final = dockerfile_stages(DOCKERFILE)[-1]
    return {int(p.split("/")[0]) for args in instructions(final, "EXPOSE") for p in args.split()}


def dockerfile_volumes() -> set[str]:
    final = dockerfile_stages(DOCKERFILE)[-1]
    return {v for args in instructions(final, "VOLUME") for v in exec_form(args)}


# --- compose -------------------------------------------------------------------------------


COMPOSE = DEPLOY / "docker" / "compose.yaml"


def compose_mounts(service: dict[str, Any]) -> dict[str, str]:
    """target path -> source, from short-syntax volumes ("src:target[:mode]")."""
    out = {}
    for v in service.get("volumes", []):
        assert isinstance(v, str), f"long-syntax volume not expected here: {v!r}"
        src, target = v.split(":")[:2]
        out[target] = src
    return out


def test_compose_runs_three_servers_with_the_real_flags() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert sorted(services) == ["ts1", "ts2", "ts3"]
    for name, service in services.items():
        argv = service["command"]
        assert isinstance(argv, list), "command: in exec form (a list), not a shell string"
        mounts = compose_mounts(service)
        args = parse_raftlet(argv)
        # The --config it passes is the file the service mounts: the shipped cluster.toml.
        source = mounts[args.config]
        assert source == "./cluster.toml"
        config = load_cluster_config(COMPOSE.parent / source)
        settings = resolve_tserver(argv, config)
        assert settings.server_id == name
        # Peers and clients dial the service name, which is the container's host name.
        assert parse_host_port(settings.server.rpc_addr)[0] == name == service["hostname"]
        # Bind all interfaces, on the ports the config advertises.
        for listen, advertised in (
            (settings.rpc_addr, settings.server.rpc_addr),
            (settings.http_addr, settings.server.http_addr),
        ):
            assert parse_host_port(listen) == ("0.0.0.0", port(advertised))
            assert port(advertised) in dockerfile_exposed()
        # The fast paths' ports are fixed, and the image says so.
        assert {settings.consensus_tcp_port, settings.write_tcp_port} <= dockerfile_exposed()
        # The data dir is on the service's own named volume, which the image declares.
        data_mount = next(t for t in mounts if settings.data_dir.is_relative_to(t))
        assert mounts[data_mount] in doc["volumes"]
        assert data_mount in dockerfile_volumes()
        # The health check asks the status server's /healthz on the listening port.
        health = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{port(settings.http_addr)}/healthz" in health
        assert "/healthz" in status_pages()
        assert service["stop_signal"] == "SIGTERM"
        assert service["image"]
        assert service["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert (COMPOSE.parent / service["build"]["context"] / "deploy/docker/Dockerfile").is_file()


def test_compose_gives_each_server_its_own_key_and_the_ca_certificate_only() -> None:
    """Mounting the whole tls/ gave every container ca.key (which signs certificates) and
    the admin client's key; the header must say how the image's user gets to read its key
    (created 0600 for whoever ran `certs create`; a bind mount keeps that owner)."""
    doc = yaml.safe_load(COMPOSE.read_text())
    for name, service in doc["services"].items():
        config = load_cluster_config(COMPOSE.parent / "cluster.toml")
        settings = resolve_tserver(service["command"], config)
        mounts = compose_mounts(service)
        tls_mounts = {t: src for t, src in mounts.items() if "tls" in src}
        assert tls_mounts == {
            settings.tls_ca: "./tls/ca.crt",
            settings.tls_cert: f"./tls/server-{name}.crt",
            settings.tls_key: f"./tls/server-{name}.key",
        }
    header = COMPOSE.read_text()
    assert f"chown {dockerfile_uid()}:{dockerfile_uid()} deploy/docker/tls/server-ts1.key" in header


def test_the_docker_build_context_leaves_certificates_and_keys_out() -> None:
    ignored = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "deploy/docker/tls" in ignored
    assert "**/*.key" in ignored


def test_the_readmes_token_port_is_none_of_the_deployments_ports() -> None:
    """README's token port example once used 7151, the port every deployment here gives
    --consensus_tcp_port: one port cannot do both jobs."""
    readme = (REPO / "README.md").read_text()
    token_ports = {
        int(m[1]) for m in re.finditer(r"token_rpc_addr[ =]+\"?[\w.\[\]:-]+:(\d+)", readme)
    }
    assert token_ports, "README shows no token port"
    fixed = dockerfile_exposed()
    service = read_unit(UNIT)["Service"]
    (exec_start,) = service["ExecStart"]
    unit = parse_raftlet(shlex.split(exec_start)[1:])
    fixed |= {unit.consensus_tcp_port, unit.write_tcp_port}
    assert {7051, 8051, 7151, 7251} <= fixed
    assert not token_ports & fixed, f"README's token port {sorted(token_ports & fixed)} is taken"


# --- Kubernetes ----------------------------------------------------------------------------


K8S = DEPLOY / "k8s"


def k8s_objects() -> Iterator[dict[str, Any]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield doc


def k8s_object(kind: str) -> dict[str, Any]:
    (obj,) = [o for o in k8s_objects() if o["kind"] == kind]
    return obj


def expand_k8s_vars(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to command/args: $(VAR) from the container's env."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_k8s_statefulset_args_parse_and_name_servers_of_the_configmap() -> None:
    sts = k8s_object("StatefulSet")
    service = k8s_object("Service")
    configmap = k8s_object("ConfigMap")
    namespace = k8s_object("Namespace")["metadata"]["name"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for obj in (sts, service, configmap):
        assert obj["metadata"]["namespace"] == namespace

    # The config file --config names is the ConfigMap's key, mounted where it says.
    config_dir, config_file = CONFIG_IN_CONTAINER.rsplit("/", 1)
    config_volume = volumes[mounts[config_dir]]
    assert config_volume["configMap"]["name"] == configmap["metadata"]["name"]
    config = parse_cluster_config(configmap["data"][config_file])

    pod_names = [f"{sts['metadata']['name']}-{i}" for i in range(spec["replicas"])]
    assert [s.id for s in config.servers] == pod_names, "server ids must be the pod names"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for pod_name in pod_names:
        env = {
            e["name"]: pod_name
            for e in container["env"]
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
        }
        # No `command`: the image's ENTRYPOINT (raftlet) runs with these args.
        command = container.get("command", [])
        if command:
            console_script(command[0])
        argv = [expand_k8s_vars(a, env) for a in command[1:] + container["args"]]
        settings = resolve_tserver(argv, config)
        assert settings.server_id == pod_name
        assert parse_raftlet(argv).config == CONFIG_IN_CONTAINER
        # The stable DNS name of this pod under the headless Service.
        fqdn = f"{pod_name}.{spec['serviceName']}.{namespace}.svc.cluster.local"
        assert parse_host_port(settings.server.rpc_addr)[0] == fqdn
        assert parse_host_port(settings.server.http_addr)[0] == fqdn
        assert parse_host_port(settings.rpc_addr) == ("0.0.0.0", ports["rpc"])
        assert parse_host_port(settings.http_addr) == ("0.0.0.0", ports["http"])
        assert port(settings.server.rpc_addr) == ports["rpc"]
        assert port(settings.server.http_addr) == ports["http"]
        assert settings.consensus_tcp_port == ports["consensus-tcp"]
        assert settings.write_tcp_port == ports["write-tcp"]
        # The data dir is on the pod's persistent volume.
        data_mount = next(t for t in mounts if settings.data_dir.is_relative_to(t))
        claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
        assert mounts[data_mount] in claims

    # Probes hit the status server on the http port: readiness /readyz (every replica here
    # working: a rolling update waits for it), the others /healthz; scrapes its /metrics.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in status_pages()
        assert get["path"] == ("/readyz" if probe == "readinessProbe" else "/healthz")
        assert get["port"] in ports
    annotations = spec["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["http"]
    assert annotations["prometheus.io/path"] in status_pages()
    # The pod runs as the image's user, so the volume (fsGroup) is writable by it.
    assert pod["securityContext"]["runAsUser"] == dockerfile_uid()
    assert pod["securityContext"]["fsGroup"] == dockerfile_uid()
    assert set(ports.values()) == dockerfile_exposed()


def test_k8s_headless_service_and_disruption_budget_select_the_pods() -> None:
    sts = k8s_object("StatefulSet")
    service = k8s_object("Service")
    pdb = k8s_object("PodDisruptionBudget")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}

    assert service["metadata"]["name"] == sts["spec"]["serviceName"]
    assert service["spec"]["clusterIP"] == "None"
    # Peers must resolve each other before they are Ready, or no leader is ever elected.
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names

    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --- Grafana -------------------------------------------------------------------------------


DASHBOARD = DEPLOY / "grafana" / "raftlet-dashboard.json"

# PromQL words that are not metric names. Functions and aggregations are recognised by the
# "(" after them.
_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset",
}  # fmt: skip


def exposed_sample_names() -> set[str]:
    """Every sample name raftlet's /metrics can contain (metrics.export_prometheus's rules:
    counters get `_total` unless they have it; histograms `_bucket`, `_sum`, `_count`)."""
    names: set[str] = set()
    for proto in ALL_PROTOTYPES:
        if proto.type is MetricType.HISTOGRAM:
            names |= {f"{proto.name}_bucket", f"{proto.name}_sum", f"{proto.name}_count"}
        else:
            names.add(exposed_name(proto))
    return names


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a restricted parser: enough for
    dashboards of selectors, functions, aggregations with by/without, and arithmetic)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range / subquery
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"(?<![\w.])\d+(\.\d+)?([eE][+-]?\d+)?", " ", text)  # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        followed_by_paren = text[m.end() :].lstrip().startswith("(")
        if word in _PROMQL_KEYWORDS or followed_by_paren:
            continue
        names.add(word)
    return names


def test_promql_parser() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, service) (rate(rpc_incoming_queue_time_us_bucket"
        '{instance=~"$instance", x="a{b}"}[$__rate_interval]))) / 1e6 + count(raft_role == 3)'
    )
    assert promql_metric_names(expr) == {"rpc_incoming_queue_time_us_bucket", "raft_role"}


def dashboard_panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def test_grafana_dashboard_queries_only_exported_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exported = exposed_sample_names()
    panels = list(dashboard_panels(doc))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    queried: set[str] = set()
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            names = promql_metric_names(target["expr"])
            assert names, f"{panel['title']!r}: no metric in {target['expr']!r}"
            unknown = names - exported
            assert not unknown, (
                f"{panel['title']!r} queries {sorted(unknown)}, which raftlet does not export "
                f"(metrics/catalogue.py; counters end in _total)"
            )
            queried |= names
    # The metrics the dashboard exists for.
    wanted = {
        "rpcs_queue_overflow_total",
        "rpc_incoming_queue_time_us_bucket",
        "consensus_lock_contention_time_us_total",
        "term_checks_total",
        "write_ops_total",
        "raft_term",
        "raft_role",
        "log_sync_latency_us_bucket",
    }
    assert wanted <= queried, f"not on the dashboard: {sorted(wanted - queried)}"
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
