"""Offline checks of deploy/: compose structure, Kubernetes built-in kinds against their schemas, FlinkDeployment fields."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ablab.platform.config import Settings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
K8S_VERSION = "1.30.0"
ABLAB_FIELDS = {f"ABLAB_{name.upper()}" for name in Settings.model_fields}
# Env read by the image's healthcheck or by the SDK/worker themselves, not Settings fields.
EXTRA_ENV = {"ABLAB_HEALTH_URL", "ABLAB_SDK_TOKEN"}


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())


def test_compose_services_have_images_valid_dependencies_and_unique_ports():
    compose = _compose()
    services = compose["services"]
    assert {"kafka", "clickhouse", "postgres", "jobmanager", "taskmanager", "api", "loader", "worker", "dashboard"} <= set(services)
    host_ports = []
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name}: no image or build"
        deps = svc.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name}: depends_on unknown service {dep}"
        for port in svc.get("ports", []):
            host_ports.append(str(port).split(":")[0])
        for key in svc.get("environment", {}):
            if key.startswith("ABLAB_"):
                assert key in ABLAB_FIELDS | EXTRA_ENV, f"{name}: {key} is not a Settings field"
    assert len(host_ports) == len(set(host_ports)), f"host ports collide: {host_ports}"
    for volume in (v.split(":")[0] for svc in services.values() for v in svc.get("volumes", [])):
        assert volume in compose["volumes"], f"undeclared volume {volume}"


def test_compose_secrets_come_from_the_environment():
    text = (DEPLOY / "docker-compose.yaml").read_text()
    for secret in ("POSTGRES_PASSWORD", "CLICKHOUSE_PASSWORD", "ABLAB_WEBHOOK_SECRET"):
        assert re.search(r"\$\{" + secret + r":\?", text), f"{secret} must be required from the environment"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "k8s/base/kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in _docs(DEPLOY / "k8s/base" / name)]


def _merge(base: object, patch: object) -> object:
    """Strategic-merge enough for our overlays: dicts recursively, lists of named items by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i for i in base + patch):
        by_name = {i["name"]: i for i in base}
        for item in patch:
            assert item["name"] in by_name, f"overlay patches unknown list item {item['name']}"
            by_name[item["name"]] = _merge(by_name[item["name"]], item)
        return list(by_name.values())
    return patch


def _overlay(name: str) -> list[dict]:
    docs = copy.deepcopy(_base())
    kustomization = yaml.safe_load((DEPLOY / f"k8s/overlays/{name}/kustomization.yaml").read_text())
    for patch_ref in kustomization["patches"]:
        for patch in _docs(DEPLOY / f"k8s/overlays/{name}" / patch_ref["path"]):
            targets = [i for i, d in enumerate(docs) if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]]
            assert targets, f"{name}: patch targets nothing: {patch['kind']}/{patch['metadata']['name']}"
            docs[targets[0]] = _merge(docs[targets[0]], patch)
    return docs


@pytest.mark.parametrize("profile", ["base", "dev", "prod"])
def test_builtin_kinds_validate_against_kubernetes_schemas(profile):
    docs = _base() if profile == "base" else _overlay(profile)
    for doc in docs:
        if doc["kind"] == "FlinkDeployment":
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert container.get("livenessProbe"), f"{doc['metadata']['name']}: no liveness probe"
                assert container["resources"]["requests"], f"{doc['metadata']['name']}: no resource requests"
                if container.get("ports"):
                    assert container.get("readinessProbe"), f"{doc['metadata']['name']}: no readiness probe"


def test_profiles_differ_where_they_should():
    dev = {d["metadata"]["name"]: d for d in _overlay("dev") if d["kind"] == "Deployment"}
    prod = {d["metadata"]["name"]: d for d in _overlay("prod") if d["kind"] == "Deployment"}
    assert dev["ablab-worker"]["spec"]["replicas"] < prod["ablab-worker"]["spec"]["replicas"]
    api = prod["ablab-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["resources"]["requests"] == api["resources"]["limits"]  # Guaranteed QoS in prod
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_configmap_keys_are_settings_fields():
    (cm,) = [d for d in _base() if d["kind"] == "ConfigMap"]
    unknown = set(cm["data"]) - ABLAB_FIELDS
    assert not unknown, f"ConfigMap keys that Settings does not read: {unknown}"
    Settings(**{k.removeprefix("ABLAB_").lower(): v for k, v in cm["data"].items()}, webhook_secret="x" * 16)


def test_flinkdeployment_uses_operator_fields():
    # Fields of the Flink Kubernetes Operator's FlinkDeployment v1beta1 CRD (FlinkDeploymentSpec, JobSpec).
    (fd,) = [d for d in _base() if d["kind"] == "FlinkDeployment"]
    assert fd["apiVersion"] == "flink.apache.org/v1beta1"
    spec = fd["spec"]
    assert set(spec) <= {"image", "imagePullPolicy", "serviceAccount", "flinkVersion", "ingress", "podTemplate", "jobManager",
                         "taskManager", "logConfiguration", "mode", "flinkConfiguration", "job", "restartNonce"}
    assert re.fullmatch(r"v\d+_\d+", spec["flinkVersion"])
    for role in ("jobManager", "taskManager"):
        assert set(spec[role]["resource"]) <= {"cpu", "memory", "ephemeralStorage"}
    job = spec["job"]
    assert set(job) <= {"jarURI", "parallelism", "entryClass", "args", "state", "savepointTriggerNonce", "initialSavepointPath",
                        "checkpointTriggerNonce", "upgradeMode", "allowNonRestoredState", "savepointRedeployNonce"}
    assert job["upgradeMode"] in {"stateless", "savepoint", "last-state"} and job["state"] in {"running", "suspended"}
    assert job["entryClass"] == "org.apache.flink.client.python.PythonDriver" and "ablab.streaming.flink.job" in job["args"]
    assert spec["flinkConfiguration"]["execution.checkpointing.dir"], "restore needs a checkpoint dir"


def test_flinkdeployment_submits_exactly_what_the_session_cluster_gets():
    """Same entry point, same flags: the operator's job.args are what `ablab stream submit
    --cluster` renders for the same settings (bootstrap from the ConfigMap, parallelism 2)."""
    from ablab.streaming.flink.cluster import cluster_job_config, submission_arguments
    from ablab.streaming.flink.job import JobConfig, _parse_args

    (fd,) = [d for d in _base() if d["kind"] == "FlinkDeployment"]
    (cm,) = [d for d in _base() if d["kind"] == "ConfigMap"]
    args = fd["spec"]["job"]["args"]
    parsed = _parse_args([a for a in args[2:] if a != "--detached"])
    assert parsed.parallelism == fd["spec"]["job"]["parallelism"] >= 2
    assert parsed.bootstrap == cm["data"]["ABLAB_KAFKA_BOOTSTRAP"]
    assert parsed.checkpoint_dir is None  # storage is the cluster's: flinkConfiguration
    expected = cluster_job_config(JobConfig(bootstrap=parsed.bootstrap, idle_timeout_s=5.0, parallelism=2))
    assert args == submission_arguments(expected)
