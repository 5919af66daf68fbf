"""helm/corl: lint, strict schema validation of every rendered manifest, and the rendered objects
a user depends on (one server set and one trainer per member, GPUs, URLs, probes, config)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from corl.config import load_config, parse_config

from .conftest import Render
from .support import CHART, container_argv, role_of, settings_class, unknown_env, venv_tool

K8S_VERSIONS = ["1.27.0", "1.37.0"]  # the chart's kubeVersion floor, and the newest schemas shipped

# A cohort unlike the default: 3 members, one frozen, one on vLLM with 2 GPU replicas, external Redis.
CUSTOM: dict[str, Any] = {
    "runId": "exp-7",
    "redis": {"enabled": False, "externalUrl": "redis://redis.infra.svc:6380/2"},
    "cohortInit": {"enabled": False},
    "storage": {"existingClaim": "shared-weights"},
    "auth": {"existingSecret": "corl-tokens", "adminTokenKey": "token"},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "aggregator": {
        "ingress": {"enabled": True, "className": "nginx", "host": "corl.test", "tlsSecretName": "corl-tls"}
    },
    "members": [
        {
            "name": "big",
            "model": "/data/models/qwen2-7b",
            "backend": "vllm",
            "replicas": 2,
            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "40Gi"}},
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "trainer": {"resources": {"limits": {"nvidia.com/gpu": 2}}},
        },
        {"name": "judge", "model": "/data/models/llama", "role": "frozen"},
        {"name": "small", "model": "/data/models/gpt2", "env": {"CORL_MAX_TOKENS": 64}},
        {
            "name": "ops-agent",  # an outside OpenAI-compatible server: no pods, its key from a Secret
            "endpoint": {
                "base_url": "https://llm.example.com/v1",
                "model": "ops-model",
                "api_key_env": "OPS_AGENT_KEY",
                "apiKeySecret": {"name": "ops-keys", "key": "api-key"},
                "max_concurrency": 8,
            },
        },
    ],
    "cohort": {
        "rounds": {"prompts_per_round": 8, "samples_per_prompt": 4, "min_quorum": 2},
        "reward": {"mode": "peer_agreement"},
        "training": {"loss_type": "dr_grpo"},
        "tracking": {"report_to": ["tensorboard", "wandb"], "project": "exp", "wandb": {"mode": "online"}},
    },
    "tracking": {"secretEnv": {"WANDB_API_KEY": {"name": "wandb", "key": "api-key"}}},
}
# Members larger than one device: a trained vLLM member on 4 GPUs (tensor parallel servers, a torchrun
# trainer), a frozen one on 2, one serving on 1 GPU with a 2-process trainer, and a CPU member.
SHARDED: dict[str, Any] = {
    "members": [
        {
            "name": "big",
            "model": "/data/models/qwen2.5-7b",
            "backend": "vllm",
            "gpus": 4,
            "vllm": {"gpu_memory_utilization": 0.85, "max_model_len": 4096},
            "resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "96Gi"}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        {"name": "judge", "model": "/data/models/llama-8b", "backend": "vllm", "role": "frozen", "gpus": 2},
        {"name": "mid", "model": "/data/models/qwen2.5-1.5b", "backend": "vllm", "gpus": 1, "trainer": {"gpus": 2}},
        {"name": "small", "model": "/data/cohort/gpt2"},
    ],
    "cohort": {"training": {"distributed": {"strategy": "fsdp2", "mixed_precision": "bf16"}}},
}
CASES = {"default": None, "custom": CUSTOM, "sharded": SHARDED}


def of(objs: list[dict[str, Any]], kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        o
        for o in objs
        if o["kind"] == kind
        and (component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]


def members_of(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The members corl serves (an ``endpoint`` member has no pods)."""
    members = (values or yaml.safe_load((CHART / "values.yaml").read_text()))["members"]
    return [m for m in members if "endpoint" not in m]


def cohort_config(objs: list[dict[str, Any]]) -> Any:
    (cm,) = of(objs, "ConfigMap", "config")
    return parse_config(yaml.safe_load(cm["data"]["cohort.yaml"]))


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def arg(container: dict[str, Any], flag: str) -> str:
    args = container_argv(container)
    return args[args.index(flag) + 1]


# --- lint and schema validation -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict(helm: str, case: str, tmp_path: Path) -> None:
    args = [helm, "lint", "--strict", str(CHART)]
    if CASES[case] is not None:
        (tmp_path / "v.yaml").write_text(yaml.safe_dump(CASES[case]))
        args += ["--values", str(tmp_path / "v.yaml")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_every_manifest_passes_strict_kubernetes_validation(
    render: Render, case: str, k8s: str, tmp_path: Path
) -> None:
    objs = render(CASES[case])
    core = [o for o in objs if o["apiVersion"] != "monitoring.coreos.com/v1"]
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(core))
    out = subprocess.run(
        [venv_tool("kubernetes-validate"), "--strict", "--quiet", "-k", k8s, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    schema = json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
    for sm in (o for o in objs if o["kind"] == "ServiceMonitor"):
        jsonschema.validate(sm, schema)


def test_strict_validation_rejects_an_unknown_field(render: Render, tmp_path: Path) -> None:
    """The check above would catch a misspelt field (guards against a validator that passes anything)."""
    (sts, *_) = of(render(None), "StatefulSet", "model")
    containers(sts)[0]["livenessProbes"] = containers(sts)[0].pop("livenessProbe")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sts))
    out = subprocess.run(
        [venv_tool("kubernetes-validate"), "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "livenessProbes" in out.stdout + out.stderr


def _assert_schema_refuses(helm: str, tmp_path: Path, values: dict) -> None:
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--values", str(tmp_path / "v.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "schema" in out.stderr, values


def test_values_schema_rejects_unknown_and_bad_values(helm: str, tmp_path: Path) -> None:
    bad: dict[str, Any]
    for bad in (
        {"membrs": []},
        {"members": [{"name": "Bad_Name", "model": "/m"}, {"name": "b", "model": "/m"}]},
        {"members": [{"name": "a", "model": "/m", "backend": "tgi"}, {"name": "b", "model": "/m"}]},
        {"tracking": {"secretEnv": {"WANDB_API_KEY": {"name": "wandb"}}}},  # no key in the Secret
    ):
        _assert_schema_refuses(helm, tmp_path, bad)


def test_every_value_is_documented() -> None:
    """Every key that values.schema.json declares has a comment right above it in values.yaml;
    keys inside free-form maps (resources, env, cohort sections) are data, and each field of a
    member is described in the comment above `members:`."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = stripped.split(":", 1)[0]
        path = [k for _, k in stack] + [key]
        stack.append((indent, key))
        node: dict[str, Any] | None = schema
        for part in path[:-1]:
            node = (node or {}).get("properties", {}).get(part)
        if not node or node.get("additionalProperties") is not False or path[0] == "members" and len(path) > 1:
            continue
        if "resources" in path[:-1]:
            continue  # requests/limits: Kubernetes' own fields
        section = stripped.split(":", 1)[1].strip() == "" and "properties" in node.get("properties", {}).get(key, {})
        if section:
            continue  # documented key by key below
        if not lines[i - 1].strip().startswith("#"):
            undocumented.append(f"{i + 1}: {'.'.join(path)}")
    assert not undocumented, "values without a comment:\n" + "\n".join(undocumented)
    members_doc = "\n".join(lines[: next(i for i, ln in enumerate(lines) if ln.startswith("members:"))])
    for field in schema["properties"]["members"]["items"]["properties"]:
        assert f"#   {field}" in members_doc or f" {field} " in members_doc, f"member field {field} undocumented"


# --- rendered objects -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_one_server_statefulset_and_service_per_member_and_one_trainer_per_trained_member(
    render: Render, case: str
) -> None:
    objs, members = render(CASES[case]), members_of(CASES[case])
    servers = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(objs, "StatefulSet", "model")}
    assert sorted(servers) == sorted(m["name"] for m in members)
    for m in members:
        assert servers[m["name"]]["spec"]["replicas"] == m.get("replicas", 1)
    services = {s["metadata"]["labels"]["corl.dev/member"] for s in of(objs, "Service", "model")}
    assert services == set(servers)
    trainers = of(objs, "Deployment", "trainer")
    trained = sorted(m["name"] for m in members if m.get("role", "trained") == "trained")
    assert sorted(t["metadata"]["labels"]["corl.dev/member"] for t in trainers) == trained
    assert all(t["spec"]["replicas"] == 1 and t["spec"]["strategy"]["type"] == "Recreate" for t in trainers)
    pdbs = {p["metadata"]["labels"]["corl.dev/member"] for p in of(objs, "PodDisruptionBudget", "model")}
    assert pdbs == set(servers)
    assert len(of(objs, "Deployment", "aggregator")) == 1 and len(of(objs, "Service", "aggregator")) == 1
    assert len(of(objs, "Deployment", "evaluator")) == 1 and len(of(objs, "Service", "evaluator")) == 1


def test_gpu_requests_images_and_scheduling_follow_the_member(render: Render) -> None:
    objs = render(CUSTOM)
    servers = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(objs, "StatefulSet", "model")}
    big = servers["big"]["spec"]["template"]["spec"]
    (c,) = big["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["image"].endswith("-gpu") and arg(c, "--backend") == "vllm"
    assert big["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert big["tolerations"][0]["key"] == "nvidia.com/gpu"
    for name in ("judge", "small"):
        (c,) = containers(servers[name])
        assert "nvidia.com/gpu" not in (c.get("resources") or {}).get("limits", {})
        assert c["image"].endswith("-cpu") and arg(c, "--backend") == "transformers"
    trainers = {t["metadata"]["labels"]["corl.dev/member"]: t for t in of(objs, "Deployment", "trainer")}
    assert containers(trainers["big"])[0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert containers(trainers["big"])[0]["image"].endswith("-gpu"), "a GPU trainer needs CUDA torch"
    assert containers(trainers["small"])[0]["image"].endswith("-cpu")
    assert env_of(containers(servers["small"])[0])["CORL_MAX_TOKENS"] == "64"


def test_a_member_asking_for_gpus_gets_them_in_every_pod_and_in_the_cohort_config(
    render: Render, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpus: 4 -> each server replica and the trainer hold 4 GPUs; the vLLM server shards the model over
    them (tensor_parallel_size 4, in its settings and in the cohort config); the trainer is a torchrun
    group of 4 processes (trainer_processes 4), on the GPU image."""
    from corl.services.model.backends.vllm_engine import engine_kwargs
    from corl.services.model.settings import ServerSettings

    objs = render(SHARDED)
    servers = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(objs, "StatefulSet", "model")}
    trainers = {t["metadata"]["labels"]["corl.dev/member"]: t for t in of(objs, "Deployment", "trainer")}
    assert sorted(trainers) == ["big", "mid", "small"]  # judge is frozen

    (trainer,) = containers(trainers["big"])
    assert trainer["command"] == ["tini", "--", "torchrun"] and trainer["image"].endswith("-gpu")
    args = [str(a) for a in trainer["args"]]
    assert args[: args.index("-m")] == [
        "--standalone", "--nnodes", "1", "--nproc-per-node", "4", "--max-restarts", "0",
    ]  # fmt: skip
    assert container_argv(trainer)[:1] == ["train"] and arg(trainer, "--member") == "big"
    assert int(arg(trainer, "--metrics-port")) == trainer["ports"][0]["containerPort"]
    assert trainer["resources"] == {"requests": {"nvidia.com/gpu": 4}, "limits": {"nvidia.com/gpu": 4}}
    shm = {v["name"]: v for v in trainers["big"]["spec"]["template"]["spec"]["volumes"]}["shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}["shm"] == "/dev/shm"

    (server,) = containers(servers["big"])
    assert server["image"].endswith("-gpu") and arg(server, "--backend") == "vllm"
    assert server["resources"] == {  # the member's own resources are kept beside the GPUs
        "requests": {"memory": "64Gi", "nvidia.com/gpu": 4},
        "limits": {"memory": "96Gi", "nvidia.com/gpu": 4},
    }
    env = {k: str(v) for k, v in env_of(server).items() if k.startswith("CORL_VLLM__")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    engine = ServerSettings(model_dir="/m").vllm  # what the server builds its vLLM engine from
    assert (engine.tensor_parallel_size, engine.gpu_memory_utilization, engine.max_model_len) == (4, 0.85, 4096)
    assert engine_kwargs("/m", engine, on_gpu=True, lora=False)["tensor_parallel_size"] == 4

    (cm,) = of(objs, "ConfigMap", "config")
    (tmp_path / "cohort.yaml").write_text(cm["data"]["cohort.yaml"])
    cfg = load_config(tmp_path / "cohort.yaml")
    big = cfg.member("big")
    assert big.vllm.tensor_parallel_size == 4 and big.trainer_processes == 4
    assert (big.vllm.gpu_memory_utilization, big.vllm.max_model_len) == (0.85, 4096)
    assert cfg.training.distributed.strategy == "fsdp2"
    judge, mid, small = cfg.member("judge"), cfg.member("mid"), cfg.member("small")
    assert (judge.vllm.tensor_parallel_size, judge.trainer_processes) == (2, 1)
    assert containers(servers["judge"])[0]["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # trainer.gpus: the trainer's own count (2 processes) while each server holds one GPU.
    assert (mid.vllm.tensor_parallel_size, mid.trainer_processes) == (1, 2)
    assert containers(servers["mid"])[0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    (mid_trainer,) = containers(trainers["mid"])
    launcher = [str(a) for a in mid_trainer["args"]]
    assert launcher[launcher.index("--nproc-per-node") + 1] == "2"
    assert mid_trainer["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # A member without gpus keeps the plain CPU pods.
    assert small.backend == "transformers" and small.trainer_processes == 1 and small.vllm.tensor_parallel_size == 1
    (small_trainer,) = containers(trainers["small"])
    assert "command" not in small_trainer and small_trainer["args"][0] == "train"
    assert small_trainer["image"].endswith("-cpu") and "nvidia.com/gpu" not in str(small_trainer["resources"])


def test_values_schema_refuses_gpus_and_vllm_options_that_cannot_be_served(helm: str, tmp_path: Path) -> None:
    vllm = {"name": "a", "model": "/m", "backend": "vllm"}
    other = {"name": "b", "model": "/m"}
    for bad in (
        {**vllm, "gpus": 0},
        {**vllm, "gpus": "4"},
        {**other, "name": "a", "gpus": 2},  # a transformers server uses one GPU
        {**other, "name": "a", "vllm": {"max_model_len": 4096}},  # engine options without vLLM
        {**vllm, "gpus": 4, "vllm": {"tensor_parallel_size": 2}},  # the GPU count comes from gpus alone
        {**vllm, "vllm": {"gpu_memory_utilization": 1.5}},
        {**vllm, "trainer": {"gpus": -1}},
        {"name": "a", "endpoint": {"base_url": "http://vllm:8000/v1", "model": "m"}, "gpus": 1},
    ):
        _assert_schema_refuses(helm, tmp_path, {"members": [bad, other]})


def test_servers_time_limit_and_token_bound_follow_the_rounds_section(render: Render) -> None:
    """Real models generate for minutes: the servers' request time limit and max_tokens bound come from
    the one rounds section (as `corl run` sets them); a member's or all servers' env still wins."""
    rounds = {"request_timeout_s": 600, "max_tokens": 512}
    values = {**CUSTOM, "cohort": {**CUSTOM["cohort"], "rounds": {**CUSTOM["cohort"]["rounds"], **rounds}}}
    servers = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(render(values), "StatefulSet", "model")}
    for name in ("big", "judge"):
        env = env_of(containers(servers[name])[0])
        assert (env["CORL_REQUEST_TIMEOUT_S"], env["CORL_MAX_TOKENS"]) == ("600", "512")
    (small,) = containers(servers["small"])
    assert [e["name"] for e in small["env"]].count("CORL_MAX_TOKENS") == 1
    assert env_of(small)["CORL_MAX_TOKENS"] == "64"
    default = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(render(None), "StatefulSet", "model")}
    for s in default.values():  # the default rounds set neither: the servers' own defaults hold
        assert not {"CORL_REQUEST_TIMEOUT_S", "CORL_MAX_TOKENS"} & set(env_of(containers(s)[0]))


@pytest.mark.parametrize("case", CASES)
def test_containers_point_at_the_right_redis_servers_config_and_secret(render: Render, case: str) -> None:
    values = CASES[case]
    objs = render(values)
    cfg = cohort_config(objs)
    if case == "custom":
        assert cfg.redis_url == CUSTOM["redis"]["externalUrl"] and not of(objs, "StatefulSet", "redis")
    else:
        (redis_svc,) = of(objs, "Service", "redis")
        port = redis_svc["spec"]["ports"][0]["port"]
        assert cfg.redis_url == f"redis://{redis_svc['metadata']['name']}:{port}/0"
        (redis,) = of(objs, "StatefulSet", "redis")
        args = containers(redis)[0]["args"]
        assert args[args.index("--appendonly") + 1] == "yes"
        assert redis["spec"]["volumeClaimTemplates"]

    # Every server URL in the config is a replica's DNS name under that member's headless Service.
    services = {s["metadata"]["name"]: s for s in of(objs, "Service", "model")}
    servers = {s["metadata"]["labels"]["corl.dev/member"]: s for s in of(objs, "StatefulSet", "model")}
    for m in cfg.served_members():
        sts = servers[m.name]
        svc = services[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None"
        port = svc["spec"]["ports"][0]["port"]
        assert m.servers == [
            f"http://{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}"
            for i in range(sts["spec"]["replicas"])
        ]
        (c,) = containers(sts)
        assert arg(c, "--name") == m.name and arg(c, "--model") == m.model
        assert int(arg(c, "--port")) == c["ports"][0]["containerPort"] == port
        assert arg(c, "--host") == "0.0.0.0"
        assert "CORL_TASK" not in env_of(c)  # the task is set once, in the cohort config
        assert env_of(c)["CORL_WEIGHTS_ROOT"] == cfg.weights_dir  # loads only what the trainers publish

    secret = (values or {}).get("auth", {}).get("existingSecret") or of(objs, "Secret", "auth")[0]["metadata"]["name"]
    key = (values or {}).get("auth", {}).get("adminTokenKey", "admin-token")
    configmap = of(objs, "ConfigMap", "config")[0]["metadata"]["name"]
    parts = (
        ("StatefulSet", "model"),
        ("Deployment", "trainer"),
        ("Deployment", "aggregator"),
        ("Deployment", "evaluator"),
        ("Deployment", "gateway"),
    )
    for kind, component in parts:
        for obj in of(objs, kind, component):
            (c,) = containers(obj)
            # The evaluator only reads: it is given no admin token.
            expected = None if component == "evaluator" else {"secretKeyRef": {"name": secret, "key": key}}
            assert env_of(c).get("CORL_ADMIN_TOKEN") == expected, obj["metadata"]["name"]
            if component != "model":
                assert arg(c, "--config") == "/etc/corl/cohort.yaml"
                mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
                vols = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
                assert mounts["cohort-config"] == "/etc/corl"
                assert vols["cohort-config"]["configMap"]["name"] == configmap
    for t in of(objs, "Deployment", "trainer"):
        assert cfg.member(arg(containers(t)[0], "--member")).role == "trained"


@pytest.mark.parametrize("case", CASES)
def test_probes(render: Render, case: str) -> None:
    objs = render(CASES[case])
    http_services = of(objs, "StatefulSet", "model") + of(objs, "Deployment", "aggregator")
    for obj in http_services + of(objs, "Deployment", "evaluator"):
        (c,) = containers(obj)
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["port"] in ("http", c["ports"][0]["containerPort"])
    for obj in of(objs, "Deployment", "trainer"):
        (c,) = containers(obj)
        assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert "startupProbe" in c
    for obj in of(objs, "StatefulSet", "redis"):
        (c,) = containers(obj)
        assert "redis-cli" in " ".join(c["livenessProbe"]["exec"]["command"])
        assert any(e["name"] == "REDISCLI_AUTH" for e in c["env"])  # the probe authenticates


def test_configmap_loads_with_the_services_config_loader(render: Render, tmp_path: Path) -> None:
    for case, values in CASES.items():
        (cm,) = of(render(values), "ConfigMap", "config")
        path = tmp_path / f"{case}.yaml"
        path.write_text(cm["data"]["cohort.yaml"])
        cfg = load_config(path)
        names = [m["name"] for m in members_of(values)]
        assert [m.name for m in cfg.served_members()] == names
        if case == "custom":
            assert cfg.run_id == "exp-7" and cfg.reward.mode == "peer_agreement"
            assert cfg.training.loss_type == "dr_grpo" and cfg.rounds.samples_per_prompt == 4
            assert cfg.member("judge").role == "frozen" and cfg.member("big").backend == "vllm"
            assert len(cfg.member("big").servers) == 2


def test_an_endpoint_member_gets_no_pods_and_its_key_reaches_only_the_aggregator_and_gateway(render: Render) -> None:
    objs = render(CUSTOM)
    ops = cohort_config(objs).member("ops-agent")
    assert ops.role == "frozen" and ops.endpoint is not None and ops.servers == []
    assert (ops.endpoint.base_url, ops.endpoint.api_key_env, ops.endpoint.max_concurrency) == (
        "https://llm.example.com/v1",
        "OPS_AGENT_KEY",
        8,
    )
    (cm,) = of(objs, "ConfigMap", "config")
    assert "apiKeySecret" not in cm["data"]["cohort.yaml"]  # the chart's own field: not in the config
    owned = [o for o in objs if o["metadata"].get("labels", {}).get("corl.dev/member") == "ops-agent"]
    assert owned == []  # no StatefulSet, Service, PodDisruptionBudget or trainer
    key = {"secretKeyRef": {"name": "ops-keys", "key": "api-key"}}
    for obj in [*of(objs, "Deployment"), *of(objs, "StatefulSet")]:
        for c in containers(obj):
            has_key = env_of(c).get("OPS_AGENT_KEY") == key  # the two that call it
            assert has_key == (obj["metadata"]["labels"]["app.kubernetes.io/component"] in ("aggregator", "gateway"))


def test_experiment_tracking_reaches_every_reporting_process_and_writes_to_the_data_volume(render: Render) -> None:
    default = render(None)
    assert cohort_config(default).tracking.report_to == []  # off by default: the aggregator needs no volume
    for reader in (*of(default, "Deployment", "aggregator"), *of(default, "Deployment", "evaluator")):
        assert [m["name"] for m in containers(reader)[0]["volumeMounts"]] == ["cohort-config"]

    objs = render(CUSTOM)
    tracking = cohort_config(objs).tracking
    assert tracking.report_to == ["tensorboard", "wandb"] and tracking.project == "exp"
    assert tracking.dir == "/data/tracking"  # on the data volume, where the trackers' files outlive pods
    key = {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    reporting = [*of(objs, "Deployment", "trainer"), *of(objs, "Deployment", "aggregator")]
    reporting += of(objs, "Deployment", "evaluator")  # held-out readings: <member>/heldout/accuracy
    for obj in reporting:
        (c,) = containers(obj)
        assert env_of(c)["WANDB_API_KEY"] == key, obj["metadata"]["name"]
        writable = [m for m in c["volumeMounts"] if m["name"] == "data" and not m.get("readOnly")]
        assert {"mountPath": "/data/tracking", "subPath": "tracking"} in [
            {k: m[k] for k in ("mountPath", "subPath")} for m in writable if "subPath" in m
        ]
        claims = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        assert claims["data"]["persistentVolumeClaim"]["claimName"] == "shared-weights"
    for sts in of(objs, "StatefulSet", "model"):  # servers report nothing: no key
        assert "WANDB_API_KEY" not in env_of(containers(sts)[0])
    own_dir = json.loads(json.dumps(CUSTOM))
    own_dir["cohort"]["tracking"]["dir"] = "/data/runs/exp-7"
    assert cohort_config(render(own_dir)).tracking.dir == "/data/runs/exp-7"
    for obj in of(render(own_dir), "Deployment", "aggregator"):  # the writable folder follows the dir
        mounts = [m for m in containers(obj)[0]["volumeMounts"] if m["name"] == "data"]
        assert mounts == [{"name": "data", "mountPath": "/data/runs/exp-7", "subPath": "runs/exp-7"}]


def test_evaluator_takes_its_values_and_can_be_left_out(render: Render, helm: str, tmp_path: Path) -> None:
    values = {
        **CUSTOM,
        "evaluator": {"port": 8300, "evalEvery": 3, "evalPrompts": 50, "env": {"CORL_EVALUATOR_POLL_S": 2}},
    }
    objs = render(values)
    (dep,) = of(objs, "Deployment", "evaluator")
    (c,) = containers(dep)
    assert (arg(c, "--eval-every"), arg(c, "--eval-prompts"), arg(c, "--port")) == ("3", "50", "8300")
    assert c["ports"][0]["containerPort"] == 8300 and env_of(c)["CORL_EVALUATOR_POLL_S"] == "2"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    (svc,) = of(objs, "Service", "evaluator")
    assert svc["spec"]["ports"][0]["port"] == 8300
    # Prometheus scrapes the evaluator: that is where corl_evaluator_heldout_accuracy_ratio comes from.
    (sm,) = of(objs, "ServiceMonitor", "evaluator")
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]

    off = render({**CUSTOM, "evaluator": {"enabled": False}})
    assert not [o for o in off if o["metadata"]["labels"].get("app.kubernetes.io/component") == "evaluator"]
    for bad in ({"evalEvery": 0}, {"evalPrompts": "all"}, {"port": 0}, {"evalevery": 3}):
        _assert_schema_refuses(helm, tmp_path, {"evaluator": bad})


def test_values_schema_refuses_a_trained_or_served_endpoint_member(helm: str, tmp_path: Path) -> None:
    endpoint = {"base_url": "http://vllm:8000/v1", "model": "m"}
    served = {"name": "a", "model": "/data/cohort/gpt2"}
    for bad in (
        {"name": "ops", "endpoint": endpoint, "role": "trained"},
        {"name": "ops", "endpoint": endpoint, "model": "/data/x"},
        {"name": "ops", "endpoint": endpoint, "replicas": 2},
        {"name": "ops", "endpoint": {**endpoint, "apiKeySecret": {"name": "s", "key": "k"}}},  # no api_key_env
        {"name": "ops", "endpoint": {**endpoint, "base_url": "https://h/v1?key=x"}},
        {"name": "ops"},
    ):
        _assert_schema_refuses(helm, tmp_path, {"members": [served, bad]})


def test_configmap_passes_unknown_cohort_fields_to_the_loader_which_rejects_them(render: Render) -> None:
    values = json.loads(json.dumps(CUSTOM))
    values["cohort"]["rounds"]["prompts_per_rnd"] = 4
    with pytest.raises(ValueError, match="prompts_per_rnd"):
        cohort_config(render(values))


def test_pod_restarts_on_config_change(render: Render) -> None:
    a = of(render(None), "Deployment", "aggregator")[0]
    b = of(render(CUSTOM), "Deployment", "aggregator")[0]
    key = "checksum/config"
    assert (
        a["spec"]["template"]["metadata"]["annotations"][key] != b["spec"]["template"]["metadata"]["annotations"][key]
    )


def test_storage_secret_and_init(render: Render) -> None:
    default = render(None)
    (pvc,) = of(default, "PersistentVolumeClaim", "storage")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    (secret,) = of(default, "Secret", "auth")
    assert len(secret["data"]["admin-token"]) > 20
    (job,) = of(default, "Job", "cohort-init")
    assert "corl cohort init --preset tiny" in containers(job)[0]["args"][0]
    for sts in of(default, "StatefulSet", "model"):
        init = sts["spec"]["template"]["spec"]["initContainers"]
        assert "cohort.json" in init[0]["args"][0]
    custom = render(CUSTOM)
    assert not of(custom, "PersistentVolumeClaim") and not of(custom, "Secret") and not of(custom, "Job")
    for sts in of(custom, "StatefulSet", "model"):
        spec = sts["spec"]["template"]["spec"]
        assert "initContainers" not in spec
        assert {v["name"]: v for v in spec["volumes"]}["data"]["persistentVolumeClaim"]["claimName"] == "shared-weights"


def _peers(rule: dict[str, Any]) -> set[str]:
    peers = rule.get("from", rule.get("to", []))
    return {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers}


@pytest.mark.parametrize("case", CASES)
def test_network_policies_deny_by_default_and_allow_only_what_corl_needs(render: Render, case: str) -> None:
    objs = render(CASES[case])
    policies = {p["metadata"]["name"].removeprefix("t-corl-"): p["spec"] for p in of(objs, "NetworkPolicy")}
    deny = policies.pop("default-deny")
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    assert "app.kubernetes.io/component" not in deny["podSelector"]["matchLabels"]  # every pod of the release
    servers = policies["model"]
    dns, sandbox = servers["egress"]  # the sandbox service alone (and its name), never anything else
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53} and _peers(sandbox) == {"sandbox"}
    (rule,) = policies["sandbox"]["ingress"][:1]
    assert _peers(rule) == {"model", "aggregator", "evaluator"} and policies["sandbox"]["egress"] == []
    (internal, metrics) = servers["ingress"]
    assert _peers(internal) == {"aggregator", "evaluator", "trainer", "gateway"}
    assert metrics["from"] == [{"namespaceSelector": {}}]  # metricsFrom
    redis_enabled = (CASES[case] or {}).get("redis", {}).get("enabled", True)
    assert ("redis" in policies) == redis_enabled
    if redis_enabled:
        (rule,) = policies["redis"]["ingress"]
        assert _peers(rule) == {"aggregator", "evaluator", "trainer", "gateway"} and policies["redis"]["egress"] == []
    for component in ("aggregator", "evaluator", "trainer", "gateway"):
        targets = set().union(*(_peers(r) for r in policies[component]["egress"] if "to" in r))
        expected = {"model", "redis"} if redis_enabled else {"model"}
        assert targets == expected | ({"sandbox"} if component in ("aggregator", "evaluator") else set()), component
    (agents,) = policies["gateway"]["ingress"]  # the agent apps: anyone by default (the cohort token guards it)
    assert agents == {"ports": [{"protocol": "TCP", "port": 8400}]}
    opened = render({"networkPolicy": {"externalEgress": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}})
    spec = {p["metadata"]["name"]: p["spec"] for p in of(opened, "NetworkPolicy")}
    assert {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]} in spec["t-corl-aggregator"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]} in spec["t-corl-gateway"]["egress"]  # outside endpoints
    narrowed = render({"networkPolicy": {"gatewayFrom": [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}]}})
    gw = {p["metadata"]["name"]: p["spec"] for p in of(narrowed, "NetworkPolicy")}["t-corl-gateway"]
    assert gw["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}]
    for never in ("t-corl-model", "t-corl-sandbox"):  # those that run or send programs: never outside
        assert all("ipBlock" not in str(r) for r in spec[never]["egress"]), never
    assert not of(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


@pytest.mark.parametrize("case", CASES)
def test_no_pod_gets_a_service_account_token_and_trainers_write_only_their_own_folders(
    render: Render, case: str
) -> None:
    objs = render(CASES[case])
    pods = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet", "Job")]
    for obj in pods:
        assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, obj["metadata"]["name"]
    for obj in of(objs, "Deployment", "trainer"):
        member = obj["metadata"]["labels"]["corl.dev/member"]
        writable = {m["mountPath"] for m in containers(obj)[0]["volumeMounts"] if not m.get("readOnly")}
        expected = {"/data/weights", f"/data/checkpoints/{member}", "/dev/shm"}
        if cohort_config(objs).tracking.report_to:
            expected.add("/data/tracking")
        assert writable <= expected and {"/data/weights", f"/data/checkpoints/{member}"} <= writable
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in containers(obj)[0]["volumeMounts"]
    for sts in of(objs, "StatefulSet", "model"):
        assert all(m.get("readOnly") for m in containers(sts)[0]["volumeMounts"] if m["name"] == "data")


def test_programs_run_only_in_the_sandbox_which_holds_nothing_but_its_token(render: Render) -> None:
    objs = render(None)
    (dep,) = of(objs, "Deployment", "sandbox")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert container_argv(c) == ["serve", "sandbox", "--host", "0.0.0.0", "--port", "8300"]
    assert set(env_of(c)) == {"CORL_SANDBOX_TOKEN"}  # no other secret, no config
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "Unconfined"}  # its jail's namespaces
    assert c["securityContext"]["procMount"] == "Unmasked" and spec["hostUsers"] is False  # its jail's /proc
    url = "http://t-corl-sandbox:8300"
    assert of(objs, "Service", "sandbox")[0]["metadata"]["name"] == "t-corl-sandbox"
    clients = (
        of(objs, "StatefulSet", "model") + of(objs, "Deployment", "aggregator") + of(objs, "Deployment", "evaluator")
    )
    for obj in clients:
        env = env_of(containers(obj)[0])
        assert env["CORL_SANDBOX_URL"] == url and env["CORL_SANDBOX_TOKEN"]["secretKeyRef"]["key"] == "sandbox-token"
    gvisor = render({"sandbox": {"runtimeClassName": "gvisor"}})
    assert of(gvisor, "Deployment", "sandbox")[0]["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"
    off = render({"sandbox": {"enabled": False}})
    assert not of(off, "Deployment", "sandbox")
    assert all("CORL_SANDBOX_URL" not in env_of(containers(o)[0]) for o in of(off, "StatefulSet", "model"))


def test_secrets_are_generated_kept_out_of_values_and_placeholders_refused(
    render: Render, helm: str, tmp_path: Path
) -> None:
    (secret,) = of(render(None), "Secret", "auth")
    assert set(secret["data"]) == {"admin-token", "cohort-token", "redis-password", "sandbox-token"}
    assert len(set(secret["data"].values())) == 4
    for bad in ("change-me-to-a-long-random-string", "short"):
        vf = tmp_path / "bad.yaml"
        vf.write_text(yaml.safe_dump({"auth": {"cohortToken": bad}}))
        out = subprocess.run([helm, "template", "t", str(CHART), "-f", str(vf)], capture_output=True, text=True)
        assert out.returncode != 0 and "auth.cohortToken" in out.stderr
    objs = render(None)
    for obj in of(objs, "StatefulSet", "model"):
        env = env_of(containers(obj)[0])
        assert env["CORL_COHORT_TOKEN"]["secretKeyRef"]["key"] == "cohort-token"
        assert env["CORL_TASKS"] == "addition" and "CORL_REDIS_PASSWORD" not in env
    for component in ("aggregator", "evaluator", "trainer"):
        for obj in of(objs, "Deployment", component):
            assert env_of(containers(obj)[0])["CORL_REDIS_PASSWORD"]["secretKeyRef"]["key"] == "redis-password"
    (redis,) = of(objs, "StatefulSet", "redis")
    args = containers(redis)[0]["args"]
    assert args[:2] == ["redis-server", "/etc/redis-auth/redis.conf"] and "noeviction" in args
    assert "requirepass" not in " ".join(args)  # the password is in a file, never on the command line


def test_monitoring_objects(render: Render) -> None:
    default = render(None)
    assert not of(default, "ServiceMonitor")
    (dash,) = of(default, "ConfigMap", "dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["corl.json"])["uid"] == "corl-cohort"
    custom = render(CUSTOM)
    monitors = {m["metadata"]["labels"]["app.kubernetes.io/component"]: m for m in of(custom, "ServiceMonitor")}
    assert set(monitors) == {"model", "trainer", "aggregator", "evaluator", "gateway"}
    for component, sm in monitors.items():
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selected = [
            s
            for s in of(custom, "Service", component)
            if all(s["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        ]
        assert selected, f"{component} ServiceMonitor selects no Service"
        port = sm["spec"]["endpoints"][0]["port"]
        assert all(port in [p["name"] for p in s["spec"]["ports"]] for s in selected)
    (ing,) = of(custom, "Ingress")
    assert ing["spec"]["rules"][0]["host"] == "corl.test" and ing["spec"]["tls"][0]["secretName"] == "corl-tls"


def test_install_notes_render(helm: str, tmp_path: Path) -> None:
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(CUSTOM))
    out = subprocess.run(
        [helm, "install", "t", str(CHART), "-n", "corl", "--dry-run=client", "--values", str(tmp_path / "v.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "big: 2 x vllm server(s) + trainer" in notes and "judge: 1 x transformers server(s) (frozen)" in notes
    assert "https://corl.test/" in notes


def test_values_schema_is_a_valid_json_schema() -> None:
    out = subprocess.run(
        [venv_tool("check-jsonschema"), "--check-metaschema", str(CHART / "values.schema.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("case", CASES)
def test_every_corl_env_var_is_a_setting_of_the_service(render: Render, case: str) -> None:
    """pydantic-settings ignores unknown CORL_* variables: a typo would silently do nothing."""
    checked = 0
    for obj in render(CASES[case]):
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in containers(obj):
            role = role_of(container_argv(c))
            if role is None:
                continue
            env = {k: str(v) for k, v in env_of(c).items()}
            bad = unknown_env(settings_class(role), env)
            assert not bad, f"{obj['metadata']['name']}: {bad} are not settings of {role.settings_class}"
            checked += 1
    members = members_of(CASES[case])
    # A server per member, a trainer per trained member, the aggregator, the evaluator, the sandbox, the gateway.
    assert checked == len(members) + sum(m.get("role", "trained") == "trained" for m in members) + 4


def test_the_gateway_reaches_every_member_and_writes_the_run_pool(render: Render) -> None:
    """The gateway's Service is the config's gateway.url; it gets the cohort token (agents and the
    servers), the admin token (canary promotions), the Redis password (the pool), the data volume read-only
    (published checksums) and the cohort config's gateway section."""
    objs = render(CUSTOM | {"cohort": {**CUSTOM["cohort"], "gateway": {"harvest": {"sample": 0.5}}}})
    cfg = cohort_config(objs)
    (svc,) = of(objs, "Service", "gateway")
    assert cfg.gateway.url == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    assert cfg.gateway.harvest.sample == 0.5
    (dep,) = of(objs, "Deployment", "gateway")
    (c,) = containers(dep)
    assert container_argv(c)[:2] == ["serve", "gateway"] and arg(c, "--config") == "/etc/corl/cohort.yaml"
    env = env_of(c)
    assert env["CORL_COHORT_TOKEN"]["secretKeyRef"]["key"] == "cohort-token"
    assert env["CORL_ADMIN_TOKEN"]["secretKeyRef"]["key"] == "token"  # CUSTOM's adminTokenKey
    assert "CORL_SANDBOX_TOKEN" not in env  # it runs no program
    assert all(m.get("readOnly") for m in c["volumeMounts"])
    assert not of(render({"gateway": {"enabled": False}}), "Deployment", "gateway")
    assert cohort_config(render({"gateway": {"enabled": False}})).gateway.url is None
