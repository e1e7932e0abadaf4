"""The cluster files in infra/ as their tools read them: the Ray cluster launcher config against Ray's own schema,
the KubeRay manifest's structure and references, the Dockerfile's layers and user, the compose file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"


def _walk(node: Any) -> list[Any]:
    out = [node]
    if isinstance(node, dict):
        for value in node.values():
            out += _walk(value)
    elif isinstance(node, list):
        for value in node:
            out += _walk(value)
    return out


def test_cluster_launcher_config_is_valid_for_ray_and_keeps_local_state_home() -> None:
    import jsonschema
    import ray

    config = yaml.safe_load((INFRA / "ray" / "cluster.yaml").read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}  # the head takes no work
    assert any("--num-cpus=0" in c for c in config["head_start_ray_commands"])
    assert all(t["min_workers"] == 0 for name, t in types.items() if name != config["head_node_type"])
    assert {".venv", "*.duckdb", "mlflow.db", "mlruns"} <= set(config["rsync_exclude"])
    assert any(t["resources"].get("gpu_80gb") for t in types.values())  # a node type that fits 14B in bf16


def test_kuberay_manifest_is_structured_and_names_only_what_it_defines_or_marks_optional() -> None:
    docs = [d for d in yaml.safe_load_all((INFRA / "ray" / "raycluster.yaml").read_text()) if d]
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["spec"]["enableInTreeAutoscaling"] is True
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    import ray

    assert cluster["spec"]["rayVersion"].rsplit(".", 1)[0] == ray.__version__.rsplit(".", 1)[0]  # the pinned minor
    groups = cluster["spec"]["workerGroupSpecs"]
    assert {g["groupName"] for g in groups} == {"gpu-24gb", "gpu-80gb"}
    for group in groups:
        assert group["minReplicas"] == 0 <= group["replicas"] <= group["maxReplicas"]
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    defined = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for node in _walk(cluster):  # every secret / config map is either in this file or optional
        if isinstance(node, dict):
            for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapRef")):
                ref = node.get(key)
                if ref is not None:
                    assert ref.get("optional") is True or (kind, ref["name"]) in defined, ref
    services = [p for p in _walk(cluster) if isinstance(p, str) and re.search(r"\w+\.\w+\.svc", p)]
    assert services == []  # no hard-coded service that no manifest defines
    params = groups[1]["rayStartParams"]["resources"]
    assert json.loads(json.loads(params)) == {"gpu_80gb": 1}


def test_dockerfile_installs_dependencies_before_the_code_has_wget_and_runs_as_a_user() -> None:
    lines = [line.strip() for line in (INFRA / "docker" / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    text = "\n".join(lines)
    assert "wget" in text  # KubeRay's probes
    copies = [i for i, line in enumerate(lines) if line.startswith("COPY")]
    code = next(i for i in copies if " cic " in lines[i] or lines[i].endswith("./cic"))
    deps = next(i for i, line in enumerate(lines) if "pip install" in line and "torch==" in line)
    assert lines[copies[0]].split()[-2] == "pyproject.toml" and copies[0] < deps < code
    user = next(i for i, line in enumerate(lines) if line.startswith("USER "))
    assert lines[user].split()[1] != "root" and user < deps


def test_compose_file_defines_every_service_it_depends_on() -> None:
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect-server", "mlflow"} <= set(services)
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name


def test_the_long_modules_scheduled_first_exist() -> None:
    """tests/conftest.py sends these to the xdist workers first; a renamed module would silently lose its place."""
    from tests.conftest import LONG_MODULES

    root = Path(__file__).resolve().parents[1]
    assert [m for m in LONG_MODULES if not (root / m).is_file()] == []
