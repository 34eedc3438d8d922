"""The Helm chart, through a real helm binary (`make setup` puts it in .tools/): every scenario
lints, renders and validates offline, and the rendered manifests carry the fields that matter."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "helm"))

import chartcheck  # noqa: E402

SCENARIOS = sorted(chartcheck.SCENARIOS.glob("*.yaml"))
Manifest = dict[str, Any]


def render(scenario: str | None = None, *sets: str) -> list[Manifest]:
    values = [chartcheck.SCENARIOS / f"{scenario}.yaml"] if scenario else []
    return chartcheck.render(values, list(sets))


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: list[Manifest], kind: str, suffix: str) -> Manifest:
    found = [m for m in of_kind(manifests, kind) if m["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[m['metadata']['name'] for m in found]}"
    return found[0]


def pod_specs(manifests: list[Manifest]) -> list[tuple[str, Manifest]]:
    return [
        (m["metadata"]["name"], m["spec"]["template"])
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
    ]


def container(workload: Manifest) -> Manifest:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env(workload: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics: matchLabels and matchExpressions, all must hold."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for rule in selector.get("matchExpressions", []):
        key, operator, values = rule["key"], rule["operator"], rule.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pod_labels(workload: Manifest) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.stem for s in SCENARIOS])
def test_scenario_lints_renders_and_validates(scenario: Path) -> None:
    assert chartcheck.check_scenario(scenario, None, chartcheck.KUBE_VERSION) == []


def test_the_validators_catch_bad_manifests() -> None:
    manifests = render("keda")
    deployment = of_kind(manifests, "Deployment")[0]
    container(deployment)["livenesProbe"] = {}
    assert "livenesProbe" in str(chartcheck.validate_builtin(deployment))
    scaled = of_kind(manifests, "ScaledObject")[0]
    scaled["spec"]["triggers"][0]["metadata"]["lagCount"] = 16
    assert "lagCount must be string" in str(chartcheck.validate_custom([scaled])[0])


def test_the_schema_refuses_bad_values() -> None:
    with pytest.raises(RuntimeError, match="engine"):
        render(None, "models[0].engine=gpu")
    with pytest.raises(RuntimeError, match="additional properties"):
        render(None, "models[0].replicas=2")


def test_vllm_workers_get_gpus_and_torch_workers_do_not() -> None:
    manifests = render("two-models")
    vllm = named(manifests, "Deployment", "worker-qwen-qwen3-8b-dcoco")
    torch = named(manifests, "Deployment", "worker-dcoco-smollm2")
    resources = container(vllm)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 2
    assert resources["requests"]["nvidia.com/gpu"] == 2
    spec = vllm["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["runtimeClassName"] == "nvidia"
    assert container(vllm)["image"] == "dcoco-worker-vllm:0.1.0"
    variables = env(vllm)
    assert variables["DCOCO_ENGINE"] == "vllm"
    assert variables["DCOCO_MODEL_NAME"] == "Qwen/Qwen3-8B-DCOCO"
    assert variables["DCOCO_NUM_SPECULATIVE_TOKENS"] == "15"
    assert json.loads(variables["DCOCO_VLLM_ARGS"]) == {
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
    }
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in spec["volumes"]

    cpu = container(torch)
    assert "nvidia.com/gpu" not in json.dumps(cpu["resources"])
    assert "tolerations" not in torch["spec"]["template"]["spec"]
    assert cpu["image"] == "dcoco-worker-cpu:0.1.0"
    assert env(torch)["DCOCO_ENGINE"] == "torch"
    # its threads follow the CPUs it requests, not every CPU of the node (worker/threads.py)
    assert env(torch)["DCOCO_CPUS"] == {
        "resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}
    }
    assert "DCOCO_CPUS" not in env(vllm)
    assert "DCOCO_THREADS" not in env(torch)
    assert "DCOCO_TARGET" not in env(torch)  # the image's embedded default model
    assert torch["spec"]["replicas"] == 2
    # The default chart: one vLLM model on one GPU.
    default = named(render(), "Deployment", "worker-dcoco-smollm2")
    assert container(default)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_registry_prefix_and_digest() -> None:
    manifests = render(
        None, "global.imageRegistry=ghcr.io/acme/", "gateway.image.tag=1.2.3", "redis.image.digest="
    )
    assert container(named(manifests, "Deployment", "gateway"))["image"] == (
        "ghcr.io/acme/dcoco-gateway:1.2.3"
    )
    digest = "sha256:" + "a" * 64
    manifests = render(None, f"engineDefaults.vllm.image.digest={digest}")
    assert container(named(manifests, "Deployment", "worker-dcoco-smollm2"))["image"] == (
        f"dcoco-worker-vllm@{digest}"
    )


def test_worker_probes_suit_minutes_long_loads_and_the_grace_period_outlasts_the_drain() -> None:
    for scenario in ("defaults", "two-models", "keda"):
        for worker in of_kind(render(scenario), "Deployment"):
            if "worker" not in worker["metadata"]["name"]:
                continue
            box = container(worker)
            startup, live, ready = (
                box[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")
            )
            assert startup["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert live["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert ready["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert box["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
            budget = startup["periodSeconds"] * startup["failureThreshold"]
            engine = env(worker)["DCOCO_ENGINE"]
            assert budget >= (1200 if engine == "vllm" else 300), (
                worker["metadata"]["name"],
                budget,
            )
            assert env(worker)["DCOCO_METRICS_HOST"] == "0.0.0.0"
            drain = float(env(worker)["DCOCO_DRAIN_TIMEOUT_S"])
            assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain
    with pytest.raises(RuntimeError, match="must exceed drainTimeoutSeconds"):
        render(None, "modelDefaults.terminationGracePeriodSeconds=20")
    gateway = container(named(render(), "Deployment", "gateway"))
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_redis_password_comes_from_its_secret() -> None:
    manifests = render()
    secret = named(manifests, "Secret", "-redis")
    assert set(secret["data"]) == {"redis-password"}
    for name in ("gateway", "worker-dcoco-smollm2"):
        workload = named(manifests, "Deployment", name)
        entries = [e["name"] for e in container(workload)["env"]]
        # $(REDIS_PASSWORD) only expands if the variable is defined earlier in the list.
        assert entries.index("REDIS_PASSWORD") < entries.index("DCOCO_REDIS_URL")
        variables = env(workload)
        assert variables["REDIS_PASSWORD"] == {
            "secretKeyRef": {"name": secret["metadata"]["name"], "key": "redis-password"}
        }
        assert variables["DCOCO_REDIS_URL"] == "redis://:$(REDIS_PASSWORD)@dcoco-redis:6379/0"
    redis = container(named(manifests, "StatefulSet", "redis"))
    assert redis["args"] == ["/etc/redis/redis.conf", "--requirepass", "$(REDIS_PASSWORD)"]
    config = named(manifests, "ConfigMap", "redis")["data"]["redis.conf"]
    assert "appendonly yes" in config
    assert "maxmemory-policy noeviction" in config
    claim = named(manifests, "StatefulSet", "redis")["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"


def test_external_redis_uses_the_existing_secret_everywhere() -> None:
    manifests = render("external-redis")
    assert not of_kind(manifests, "StatefulSet")
    assert not [s for s in of_kind(manifests, "Secret")]
    for workload in of_kind(manifests, "Deployment"):
        variables = env(workload)
        assert variables["REDIS_PASSWORD"] == {
            "secretKeyRef": {"name": "shared-redis", "key": "password"}
        }
        assert variables["DCOCO_REDIS_URL"] == (
            "rediss://:$(REDIS_PASSWORD)@redis.shared.svc.cluster.local:6380/2"
        )
    auth = of_kind(manifests, "TriggerAuthentication")[0]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "shared-redis", "key": "password"}
    ]
    trigger = of_kind(manifests, "ScaledObject")[0]["spec"]["triggers"][0]
    assert trigger["metadata"]["address"] == "redis.shared.svc.cluster.local:6380"
    assert trigger["metadata"]["databaseIndex"] == "2"
    assert trigger["metadata"]["enableTLS"] == "true"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    with pytest.raises(RuntimeError, match=r"externalRedis\.host"):
        render(None, "redis.enabled=false")


def test_api_keys_are_a_mounted_secret() -> None:
    gateway = named(render("auth"), "Deployment", "gateway")
    variables = env(gateway)
    assert variables["DCOCO_API_KEYS_FILE"] == "/etc/dcoco/api-keys/keys"
    assert variables["DCOCO_RATE_LIMIT_RPM"] == "600"
    assert variables["DCOCO_MAX_CONCURRENT_PER_KEY"] == "8"
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] == "dcoco-api-keys"
    mounts = {m["name"]: m for m in container(gateway)["volumeMounts"]}
    assert mounts["api-keys"] == {
        "name": "api-keys",
        "mountPath": "/etc/dcoco/api-keys",
        "readOnly": True,
    }
    manifests = render("ingress")
    created = named(manifests, "Secret", "api-keys")
    assert created["stringData"]["api-keys"].split() == ["sk-example-one", "sk-example-two"]
    gateway = named(manifests, "Deployment", "gateway")
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] == created["metadata"]["name"]
    with pytest.raises(RuntimeError, match=r"auth\.apiKeys or auth\.existingSecret"):
        render(None, "auth.enabled=true")


def test_keda_scales_each_model_on_its_stream_lag() -> None:
    manifests = render("keda")
    worker = named(manifests, "Deployment", "worker-qwen3-8b-dcoco")
    assert "replicas" not in worker["spec"]  # KEDA owns the replica count
    scaled = of_kind(manifests, "ScaledObject")[0]
    assert scaled["spec"]["scaleTargetRef"] == {"name": worker["metadata"]["name"]}
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] == 8
    trigger = scaled["spec"]["triggers"][0]
    assert (trigger["type"], trigger["name"]) == ("redis-streams", "lag")
    # A consumer group plus lagCount is lag mode (XINFO GROUPS); pendingEntriesCount would read
    # 0 with no consumer running and could never wake the model from zero.
    assert trigger["metadata"] == {
        "address": "dcoco-redis:6379",
        "databaseIndex": "0",
        "stream": "dcoco:qwen3-8b-dcoco:requests",
        "consumerGroup": "workers",
        "lagCount": "16",
        "activationLagCount": "0",
    }
    auth = of_kind(manifests, "TriggerAuthentication")[0]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert (
        auth["spec"]["secretTargetRef"][0]["name"]
        == named(manifests, "Secret", "-redis")["metadata"]["name"]
    )
    gateway = named(manifests, "Deployment", "gateway")
    # At zero workers the gateway must stay ready and queue, and wait out the cold start.
    assert env(gateway)["DCOCO_READYZ_REQUIRES_WORKERS"] == "false"
    assert env(gateway)["DCOCO_QUEUE_TIMEOUT_S"] == env(worker)["DCOCO_QUEUE_TIMEOUT_S"] == "900"
    with pytest.raises(RuntimeError, match="shorter than the cold start"):
        render("keda", "queue.timeoutSeconds=300")
    assert (
        env(named(render("keda", "queue.timeoutSeconds=1200"), "Deployment", "gateway"))[
            "DCOCO_QUEUE_TIMEOUT_S"
        ]
        == "1200"
    )
    # Without KEDA: no ScaledObject, a fixed replica count, the 30 s default timeout.
    plain = render()
    assert not of_kind(plain, "ScaledObject")
    assert not of_kind(plain, "TriggerAuthentication")
    assert env(named(plain, "Deployment", "gateway"))["DCOCO_QUEUE_TIMEOUT_S"] == "30"


def test_keda_also_scales_on_capacity_with_the_query_the_rule_tests_check() -> None:
    """The capacity trigger reads the recording rule that monitoring/capacity-test.yaml tests,
    with the very query those tests evaluate (there for models long, short and m)."""
    manifests = render("keda")
    lag, capacity = of_kind(manifests, "ScaledObject")[0]["spec"]["triggers"]
    assert lag["name"] == "lag"
    assert capacity["type"] == "prometheus"
    assert (capacity["name"], capacity["metricType"]) == ("capacity", "AverageValue")
    assert capacity["metadata"] == {
        "serverAddress": "http://prometheus-operated.monitoring:9090",
        "query": 'sum(model:dcoco_backlog_worker_seconds:rate5m{model="qwen3-8b-dcoco"})'
        " or vector(0)",
        "threshold": "30",
    }
    tests = (ROOT / "monitoring" / "capacity-test.yaml").read_text()
    for model in ("long", "short", "m"):
        assert capacity["metadata"]["query"].replace("qwen3-8b-dcoco", model) in tests
    rules = named(manifests, "PrometheusRule", "dcoco")["spec"]["groups"]
    recorded = {r.get("record") for g in rules for r in g["rules"]}
    assert "model:dcoco_backlog_worker_seconds:rate5m" in recorded
    with pytest.raises(RuntimeError, match="serverAddress is required"):
        render("keda", "models[0].autoscaling.capacity.serverAddress=")
    lag_only = render("keda", "models[0].autoscaling.capacity.enabled=false")
    assert [t["name"] for t in of_kind(lag_only, "ScaledObject")[0]["spec"]["triggers"]] == ["lag"]


def test_network_policies_admit_only_what_they_should() -> None:
    manifests = render("ingress")
    policies = {
        p["metadata"]["name"].rsplit("-", 1)[-1]: p for p in of_kind(manifests, "NetworkPolicy")
    }
    gateway = pod_labels(named(manifests, "Deployment", "gateway"))
    worker = pod_labels(named(manifests, "Deployment", "worker-dcoco-smollm2"))
    redis = pod_labels(named(manifests, "StatefulSet", "redis"))
    prometheus = {"app.kubernetes.io/name": "prometheus"}

    def admitted(policy: Manifest, labels: dict[str, str], port: str) -> bool:
        for rule in policy["spec"]["ingress"]:
            if port not in [p["port"] for p in rule["ports"]]:
                continue
            if "from" not in rule:
                return True
            if any(
                "podSelector" in peer and selects(peer["podSelector"], labels)
                for peer in rule["from"]
            ):
                return True
        return False

    assert selects(policies["gateway"]["spec"]["podSelector"], gateway)
    assert not selects(policies["gateway"]["spec"]["podSelector"], worker)
    assert selects(policies["worker"]["spec"]["podSelector"], worker)
    assert selects(policies["redis"]["spec"]["podSelector"], redis)
    assert not selects(policies["redis"]["spec"]["podSelector"], gateway)
    # Redis: the release's gateway and workers only.
    assert admitted(policies["redis"], gateway, "redis")
    assert admitted(policies["redis"], worker, "redis")
    assert not admitted(policies["redis"], prometheus, "redis")
    assert not admitted(
        policies["redis"], gateway | {"app.kubernetes.io/instance": "other"}, "redis"
    )
    # Workers: the metrics port, to Prometheus only.
    assert admitted(policies["worker"], prometheus, "metrics")
    assert not admitted(policies["worker"], gateway, "metrics")
    assert [p["port"] for r in policies["worker"]["spec"]["ingress"] for p in r["ports"]] == [
        "metrics"
    ]
    # Gateway: restricted here to the ingress controller's namespace, plus Prometheus.
    peers = policies["gateway"]["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    } in peers
    assert admitted(policies["gateway"], prometheus, "http")
    # By default the gateway is open to all; KEDA reaches Redis only when a model autoscales.
    assert "from" not in named(render(), "NetworkPolicy", "gateway")["spec"]["ingress"][0]
    keda_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app": "keda-operator"}},
    }
    assert (
        keda_peer in named(render("keda"), "NetworkPolicy", "redis")["spec"]["ingress"][0]["from"]
    )
    assert keda_peer not in policies["redis"]["spec"]["ingress"][0]["from"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.stem for s in SCENARIOS])
def test_every_pod_is_locked_down(scenario: Path) -> None:
    for name, template in pod_specs(render(scenario.stem)):
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        for box in spec["containers"]:
            context = box["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["runAsNonRoot"] is True, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert {"name": "tmp", "mountPath": "/tmp"} in box["volumeMounts"], name
    for account in of_kind(render(scenario.stem), "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False


def test_monitoring_resources_carry_the_shipped_rules_and_dashboard() -> None:
    manifests = render("two-models")
    files = chartcheck.CHART / "files"
    rule = of_kind(manifests, "PrometheusRule")[0]
    assert rule["spec"] == yaml.safe_load((files / "dcoco-rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    board = named(manifests, "ConfigMap", "dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "DCOCO"}
    assert (
        board["data"]["dcoco-dashboard.json"]
        == (files / "dcoco-dashboard.json").read_text().strip()
    )
    service = named(manifests, "Service", "gateway")
    monitor = of_kind(manifests, "ServiceMonitor")[0]
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]
    pods = of_kind(manifests, "PodMonitor")[0]
    workers = [w for w in of_kind(manifests, "Deployment") if "worker" in w["metadata"]["name"]]
    assert len(workers) == 2
    for worker in workers:
        assert selects(pods["spec"]["selector"], pod_labels(worker))
        assert pods["spec"]["podMetricsEndpoints"][0]["port"] in [
            p["name"] for p in container(worker)["ports"]
        ]
    assert not selects(
        pods["spec"]["selector"], pod_labels(named(manifests, "Deployment", "gateway"))
    )


def test_model_names_become_resource_names_and_must_be_distinct() -> None:
    manifests = render("two-models")
    names = sorted(d["metadata"]["name"] for d in of_kind(manifests, "Deployment"))
    assert names == [
        "dcoco-gateway",
        "dcoco-worker-dcoco-smollm2",
        "dcoco-worker-qwen-qwen3-8b-dcoco",
    ]
    with pytest.raises(RuntimeError, match="map to the same resource name"):
        render(None, "models[0].name=a.b", "models[1].name=a_b")


def test_a_model_that_scales_to_zero_is_registered_by_a_hook_job() -> None:
    """Before its first worker runs, the model's card must be in Redis, or the gateway answers
    404 and KEDA never sees lag to wake a worker for."""
    manifests = render("keda")
    job = named(manifests, "Job", "register-qwen3-8b-dcoco")
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "post-install,post-upgrade"
    assert container(job)["command"] == ["dcoco", "worker", "--register-only"]
    worker = named(manifests, "Deployment", "worker-qwen3-8b-dcoco")
    for name in ("DCOCO_MODEL_NAME", "DCOCO_TARGET", "DCOCO_REDIS_URL"):
        assert env(job)[name] == env(worker)[name]
    cache = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}["model-cache"]
    assert cache["persistentVolumeClaim"]["claimName"].endswith("cache-qwen3-8b-dcoco")
    redis_policy = named(manifests, "NetworkPolicy", "-redis")
    allowed = redis_policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert selects(allowed, pod_labels(job))
    assert not of_kind(render(), "Job")  # a model that never scales to zero needs none
