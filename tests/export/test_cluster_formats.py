"""The cluster platforms' exports, each checked against the platform's published schema or documented keys
(sources below; no cluster is contacted) and read back the way vLLM reads its options (the simulator
parses `vllm serve` as vLLM does).

Sources of the keys:
- vLLM production-stack: helm/values.schema.json and helm/templates/{deployment-vllm-multi.yaml,_helpers.tpl}
  at github.com/vllm-project/production-stack@a6c01db05f65f556235413ba8dbcfb0c01132fff (servingEngineSpec,
  modelSpec[] items, vllmConfig.extraArgs; repository, tag, requestCPU, requestMemory are `required` there).
- KServe: config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml at
  github.com/kserve/kserve@aaac4e294dae2c7b1aa1886447793f3aa1c30912 (v1alpha2 spec; model.uri required;
  a container's core/v1 schema), and charts/kserve-runtime-configs/files/llmisvcconfigs/resources.yaml
  (`eval "exec vllm serve /mnt/models --served-model-name {{ .Spec.Model.Name }} ... ${VLLM_ADDITIONAL_ARGS}"`).
- llm-d: llm-d-incubation/llm-d-modelservice charts/llm-d-modelservice/values.yaml (decode.containers[] with
  name, image, args, env, resources: a core/v1 Container).
- Ray Serve LLM: ray-project/ray python/ray/llm/_internal/serve/core/configs/llm_config.py (LLMConfig,
  ModelLoadingConfig fields), python/ray/serve/schema.py (ServeApplicationSchema), and
  https://docs.ray.io/en/latest/serve/llm/user-guides/configuration.html.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.analysis.selection import select
from autotuner.errors import UserInputError
from autotuner.export.cluster import k8s_escape
from autotuner.export.exporter import run_export
from autotuner.store.db import TrialRecord
from tests.export.test_formats import POLICY, assert_clean, assert_same_flags, export, sim_parse
from tests.support.studies import SECRET, MakeStudy, StudyDb, trial

# production-stack helm/values.schema.json: the keys of servingEngineSpec, of a modelSpec item, of vllmConfig.
SERVING_ENGINE_KEYS = {"configs", "containerPort", "containerSecurityContext", "enableEngine", "extraPorts",
                       "imagePullPolicy", "labels", "livenessProbe", "modelSpec", "readinessProbe",
                       "runtimeClassName", "schedulerName", "securityContext", "serviceMonitor", "servicePort",
                       "sidecar", "startupProbe", "strategy", "tolerations", "vllmApiKey"}
MODEL_SPEC_KEYS = {"affinity", "annotations", "enableLoRA", "enabled", "env", "envFromSecret", "extraVolumeMounts",
                   "extraVolumes", "hf_token", "imagePullSecret", "initContainer", "keda", "labels", "limitCPU",
                   "limitGPUCores", "limitGPUMem", "limitGPUMemPercentage", "limitMemory", "lmcacheConfig",
                   "modelRevision", "modelURL", "name", "nodeName", "nodeSelectorTerms", "podAnnotations",
                   "podLabels", "priorityClassName", "pvcAccessMode", "pvcAnnotations", "pvcLabels",
                   "pvcMatchLabels", "pvcStorage", "raySpec", "replicaCount", "repository", "requestCPU",
                   "requestGPU", "requestGPUCores", "requestGPUMem", "requestGPUMemPercentage", "requestGPUType",
                   "requestMemory", "resources", "runtimeClassName", "serviceAccountName", "serviceAnnotations",
                   "shmSize", "storageClass", "tag", "tolerations", "tolerationsPolicy", "vllmConfig"}
VLLM_CONFIG_KEYS = {"convert", "dtype", "enableChunkedPrefill", "enablePrefixCaching", "extraArgs",
                    "gpuMemoryUtilization", "maxLoras", "maxModelLen", "maxNumSeqs", "runner",
                    "tensorParallelSize", "v0"}
CHART_REQUIRED = {"repository", "tag", "requestCPU", "requestMemory"}
# KServe's CRD, version v1alpha2.
LLMISVC_SPEC_KEYS = {"annotations", "baseRefs", "kvCacheOffloading", "labels", "model", "parallelism", "prefill",
                     "replicas", "rolloutStrategy", "router", "scaling", "storageInitializer", "template", "tracing",
                     "worker"}
LLMISVC_MODEL_KEYS = {"confidential", "lora", "name", "uri"}
# core/v1 Container (the CRD's template.containers items), the keys these exports use, and EnvVar.
CONTAINER_KEYS = {"args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle", "livenessProbe",
                  "name", "ports", "readinessProbe", "resources", "securityContext", "startupProbe", "volumeMounts",
                  "workingDir"}
ENV_VAR_KEYS = {"name", "value", "valueFrom"}
# Ray: ServeApplicationSchema, LLMConfig, ModelLoadingConfig.
RAY_APP_KEYS = {"name", "route_prefix", "import_path", "runtime_env", "deployments", "args"}
LLM_CONFIG_KEYS = {"runtime_env", "model_loading_config", "llm_engine", "engine_kwargs", "accelerator_type",
                   "placement_group_config", "lora_config", "deployment_config", "experimental_configs",
                   "log_engine_metrics", "callback_config"}
MODEL_LOADING_KEYS = {"model_id", "model_source", "tokenizer_source"}


@pytest.fixture(scope="module")
def winner(study_db: StudyDb) -> TrialRecord:
    return select(study_db.storage, None, [], POLICY).chosen


def certificate_comments(text: str, study: StudyDb, winner: TrialRecord) -> None:
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert f"study {study.name}, trial {winner.trial_number}" in comments
    assert "HF_TOKEN" in comments and "VLLM_API_KEY" in comments  # named, never valued


def check_env(env: list[dict[str, Any]]) -> dict[str, Any]:
    for item in env:
        assert set(item) <= ENV_VAR_KEYS and set(item) & {"value", "valueFrom"}, item
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in env}


def check_container(container: dict[str, Any], gpus: int) -> dict[str, Any]:
    assert set(container) <= CONTAINER_KEYS and "name" in container
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    env = check_env(container["env"])
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "vllm-secrets", "key": "HF_TOKEN"}}
    assert env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin assigns a pod's GPUs
    return env


def test_helm_values(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "helm-values", tmp_path / "values.yaml")
    assert_clean(text)
    certificate_comments(text, study_db, winner)
    engine = yaml.safe_load(text)["servingEngineSpec"]
    assert set(engine) <= SERVING_ENGINE_KEYS
    assert engine["vllmApiKey"] == {"secretName": "vllm-secrets", "secretKey": "VLLM_API_KEY"}
    (spec,) = engine["modelSpec"]
    assert set(spec) <= MODEL_SPEC_KEYS and set(spec) >= CHART_REQUIRED
    assert set(spec["vllmConfig"]) <= VLLM_CONFIG_KEYS
    assert (spec["repository"], spec["tag"], spec["modelURL"]) == ("vllm/vllm-openai", "v0.32.0", "llama-2-13b")
    assert spec["requestGPU"] == 8
    extra = spec["vllmConfig"]["extraArgs"]
    assert all(isinstance(a, str) for a in extra)  # the schema's items: string
    # The chart runs `vllm serve MODEL --host ... --port ...` then the extraArgs.
    assert_same_flags(sim_parse([spec["modelURL"], *extra]), winner.flags)
    env = check_env(spec["env"])
    assert "VLLM_API_KEY" not in env  # the chart sets it from vllmApiKey
    certificate = json.loads(spec["annotations"]["autotuner.dev/certificate"])
    assert (certificate["study"], certificate["trial"]) == (study_db.name, winner.trial_number)


def test_kserve(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "kserve", tmp_path / "llmisvc.yaml")
    assert_clean(text)
    certificate_comments(text, study_db, winner)
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1alpha2", "LLMInferenceService")
    assert set(doc["spec"]) <= LLMISVC_SPEC_KEYS and set(doc["spec"]["model"]) <= LLMISVC_MODEL_KEYS
    assert doc["spec"]["model"] == {"uri": "hf://llama-2-13b", "name": "llama-2-13b"}
    (container,) = doc["spec"]["template"]["containers"]
    assert container["name"] == "main"  # the name KServe's config merges with
    env = check_container(container, gpus=8)
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-secrets", "key": "VLLM_API_KEY"}}
    # KServe's config eval's the variable into `vllm serve /mnt/models ...`: read it as a shell would (the
    # simulator knows the model by its preset name, where KServe mounts it at /mnt/models).
    served = doc["spec"]["model"]["name"]
    argv = ["llama-2-13b", "--served-model-name", served, *shlex.split(env["VLLM_ADDITIONAL_ARGS"])]
    assert_same_flags(sim_parse(argv), winner.flags)
    assert json.loads(doc["metadata"]["annotations"]["autotuner.dev/certificate"])["trial"] == winner.trial_number


def test_k8s_args(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "k8s-args", tmp_path / "container.yaml")
    assert_clean(text)
    certificate_comments(text, study_db, winner)
    container = yaml.safe_load(text)
    check_container(container, gpus=8)
    assert container["command"] == ["vllm", "serve"] and container["args"][0] == "llama-2-13b"
    assert all(isinstance(a, str) for a in container["args"])
    assert_same_flags(sim_parse(container["args"]), winner.flags)


def test_ray_serve(study_db: StudyDb, winner: TrialRecord, tmp_path: Path) -> None:
    text = export(study_db, "ray-serve", tmp_path / "serve.yaml")
    assert_clean(text)
    certificate_comments(text, study_db, winner)
    (app,) = yaml.safe_load(text)["applications"]
    assert set(app) <= RAY_APP_KEYS and app["import_path"] == "ray.serve.llm:build_openai_app"
    (config,) = app["args"]["llm_configs"]
    assert set(config) <= LLM_CONFIG_KEYS and set(config["model_loading_config"]) <= MODEL_LOADING_KEYS
    assert config["runtime_env"] == {"env_vars": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}  # no secret in it
    # engine_kwargs are vLLM's EngineArgs: the simulator's parser names its fields the same way.
    parsed = sim_parse(["llama-2-13b"])
    kwargs = config["engine_kwargs"]
    assert set(kwargs) <= set(parsed)
    assert kwargs == {name.replace("-", "_"): value for name, value in winner.flags.items()}


def test_values_that_kubernetes_or_a_shell_would_expand(make_study: MakeStudy, tmp_path: Path) -> None:
    """`$(VAR)` in a container's args/env is expanded by Kubernetes, `$x;` in an eval'd string by the shell:
    both reach vLLM as written."""
    chosen = trial(1, 100.0, 2.0, flags={"chat-template": "t $(X); rm -rf /", "max-num-seqs": 64})
    study = make_study([chosen], engine={"served_model_name": "m$(HOME)x", "env": {"NOTE": "a $(B) c; $HOME"}})
    container = yaml.safe_load(export(study, "k8s-args", tmp_path / "c.yaml"))
    assert container["args"][1:3] == ["--served-model-name", "m$$(HOME)x"]
    assert {"name": "NOTE", "value": "a $$(B) c; $HOME"} in container["env"]
    service = yaml.safe_load(export(study, "kserve", tmp_path / "k.yaml"))
    env = {e["name"]: e.get("value") for e in service["spec"]["template"]["containers"][0]["env"]}
    words = shlex.split(env["VLLM_ADDITIONAL_ARGS"].replace("$$(", "$("))  # Kubernetes, then the shell
    assert words[words.index("--chat-template") + 1] == "t $(X); rm -rf /"
    assert k8s_escape("$(A) $B $$(C)") == "$$(A) $B $$$(C)"


@pytest.mark.parametrize("fmt", ["helm-values", "kserve", "k8s-args", "ray-serve"])
def test_a_model_that_reads_as_an_option_is_refused(make_study: MakeStudy, tmp_path: Path, fmt: str) -> None:
    study = make_study(engine={"model": "--trust-remote-code"})
    out = tmp_path / "out.yaml"
    with pytest.raises(UserInputError, match="starts with '-'"):
        run_export(study.storage, None, [], POLICY, fmt, out, force=False, allow_unverified=True)
    assert not out.exists()


def test_no_secret_value_in_any_cluster_format(make_study: MakeStudy, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_ENV", "value-from-the-tuners-environment")
    study = make_study(engine={"env": {"HF_TOKEN": SECRET, "OTHER": "${FROM_ENV}"}})
    for fmt in ("helm-values", "kserve", "k8s-args", "ray-serve"):
        text = export(study, fmt, tmp_path / f"{fmt}.yaml")
        assert SECRET not in text and "${FROM_ENV}" not in text and "value-from" not in text, fmt
        assert "OTHER" in text, fmt  # named: the deployment supplies it
