"""deploy/kubernetes/: every manifest is valid against the Kubernetes schemas
(kubernetes-validate, offline, strict), and every name and port one refers to exists:
Services and the PodDisruptionBudget select the gateway pods, target ports and probe
ports are the container's, Secrets named by envFrom exist with the keys used, the
workers and the KEDA ScaledObject reach the gateway Service's gRPC port, the trigger
metadata is what the gateway's scaler accepts, and the tokens have the roles they need.
KEDA's ScaledObject has no packaged schema, so it gets the structural check only.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dtq_gateway.rpc.auth import METHOD_ROLES, parse_tokens
from dtq_gateway.rpc.keda_scaler import parse_trigger
from dtq_gateway.settings import Settings

yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) reads the manifests")
kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate (dev extra) holds the schemas")

DIR = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def docs() -> list[dict]:
    out = []
    for path in sorted(DIR.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs() if d["kind"] == kind}


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env(c: dict) -> dict[str, str]:
    """The container's environment: plain values and the keys of its Secrets."""
    secrets = by_kind("Secret")
    out = {e["name"]: e.get("value", "") for e in c.get("env", [])}
    for source in c.get("envFrom", []):
        name = source["secretRef"]["name"]
        assert name in secrets, f"envFrom names Secret {name!r}, which no manifest defines"
        out.update(secrets[name]["stringData"])
    return out


def service_port(address: str) -> tuple[dict, dict]:
    """The Service and its port an address ``<service>:<port>`` names."""
    host, _, port = address.rpartition(":")
    services = by_kind("Service")
    assert host in services, f"{address}: no Service {host!r}"
    ports = [p for p in services[host]["spec"]["ports"] if p["port"] == int(port)]
    assert ports, f"{address}: Service {host!r} has no port {port}"
    return services[host], ports[0]


def test_the_expected_objects_exist() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs()}
    assert kinds == {("Deployment", "dtq-gateway"), ("Service", "dtq-gateway"),
                     ("PodDisruptionBudget", "dtq-gateway"), ("Deployment", "dtq-worker"),
                     ("ScaledObject", "dtq-worker"), ("Secret", "dtq-gateway"),
                     ("Secret", "dtq-worker")}


@pytest.mark.parametrize("doc", [d for d in docs() if d["kind"] != "ScaledObject"],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_matches_the_kubernetes_schema(doc: dict) -> None:
    kv.validate(doc, kv.latest_version(), strict=True)


def test_the_validator_refuses_an_unknown_field() -> None:
    bad = copy.deepcopy(by_kind("Deployment")["dtq-gateway"])
    container(bad)["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def test_selectors_and_ports_refer_to_the_gateway_pods() -> None:
    gateway = by_kind("Deployment")["dtq-gateway"]
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c = container(gateway)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    service = by_kind("Service")["dtq-gateway"]
    assert service["spec"]["selector"].items() <= labels.items()
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, f"Service targetPort {port['targetPort']!r}"
    pdb = by_kind("PodDisruptionBudget")["dtq-gateway"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < gateway["spec"]["replicas"]
    # the probes: gRPC health on the gRPC port, liveness on the same port
    assert c["readinessProbe"]["grpc"]["port"] == ports["grpc"]
    assert c["livenessProbe"]["tcpSocket"]["port"] in ports
    values = env(c)
    assert values["DTQ_LISTEN"].rpartition(":")[2] == str(ports["grpc"])
    assert values["DTQ_METRICS_PORT"] == str(ports["metrics"])


def test_gateway_environment_names_real_settings() -> None:
    names = {f"DTQ_{f.upper()}" for f in Settings.__dataclass_fields__}
    values = env(container(by_kind("Deployment")["dtq-gateway"]))
    assert set(values) <= names, set(values) - names
    assert all(len(s.encode()) >= 16 for s in values["DTQ_LEASE_SECRET"].split(","))
    assert values["DTQ_REDIS_URL"].startswith("redis")


def test_workers_and_keda_reach_the_gateway_with_tokens_of_the_right_role() -> None:
    gateway = by_kind("Deployment")["dtq-gateway"]
    grpc_port = {p["name"]: p["containerPort"] for p in container(gateway)["ports"]}["grpc"]
    tokens = parse_tokens(env(container(gateway))["DTQ_AUTH_TOKENS"])
    worker = by_kind("Deployment")["dtq-worker"]
    values = env(container(worker))
    _, port = service_port(values["DTQ_GATEWAY"])
    assert port["targetPort"] in ("grpc", grpc_port)
    assert tokens[values["DTQ_TOKEN"]].role == "worker"

    scaled = by_kind("ScaledObject")["dtq-worker"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert "replicas" not in worker["spec"]  # KEDA owns the replica count
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] in ("external", "external-push")
    meta = trigger["metadata"]
    _, port = service_port(meta["scalerAddress"])
    assert port["targetPort"] in ("grpc", grpc_port)
    parsed = parse_trigger(meta)  # the gateway's scaler accepts the trigger metadata
    assert set(parsed.queues) <= set(values["DTQ_QUEUES"].split(","))
    # KEDA resolves tokenFromEnv from the scale target's container environment
    scaler_token = values[meta["tokenFromEnv"]]
    role = tokens[scaler_token].role
    assert role in METHOD_ROLES["/externalscaler.ExternalScaler/GetMetrics"]
    assert role != "admin"
