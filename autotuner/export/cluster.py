"""The chosen configuration for the platforms that run vLLM on a cluster: the vLLM production-stack Helm
chart's values, a KServe LLMInferenceService, a Kubernetes container (`args:`, for llm-d or a plain
Deployment) and a Ray Serve LLM application. Each carries the certificate (comments, and an annotation
where the platform has one) and names the variables the deployment supplies without their values: a
secret becomes a `secretKeyRef` to the variable's own name in one Secret, never its value.

The keys are the platforms' published ones (tests/export/test_cluster_formats.py cites each schema);
the flags are rendered by `flag_argv`, the one vLLM spelling, and no cluster is contacted.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from typing import Any

import yaml

from autotuner.engine.launch import API_KEY_VAR
from autotuner.export.formats import Deployment, _header, _image, check_env_names
from autotuner.vllm import flag_argv

# The one Secret every cluster export refers to: each secret variable is a key of it, named as the variable.
SECRET_NAME = "vllm-secrets"
CERTIFICATE_ANNOTATION = "autotuner.dev/certificate"
GPU_RESOURCE = "nvidia.com/gpu"
# Host memory a vLLM pod asks for besides what --cpu-offload-gb moves there: the weights pass through it.
BASE_MEMORY_GIB = 16
CPU_REQUEST = "8"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def k8s_escape(value: str) -> str:
    """Kubernetes expands `$(NAME)` in a container's command, args and env values; `$$(` is a literal
    `$(`, so a flag value or variable holding one reaches vLLM as written."""
    return value.replace("$(", "$$(")


def resource_name(d: Deployment) -> str:
    """A DNS-1123 label (what Kubernetes names objects with) from the served name or the model."""
    label = _DNS_LABEL.sub("-", (d.served_model_name or d.model).lower()).strip("-")[:63].strip("-")
    return label or "vllm"


def certificate_annotation(d: Deployment) -> dict[str, str]:
    return {CERTIFICATE_ANNOTATION: json.dumps(d.certificate.to_dict(), default=str, separators=(",", ":"))}


def named_args(d: Deployment) -> list[str]:
    """The options after the model: the served name, then the tuned and fixed flags."""
    named = ["--served-model-name", d.served_model_name] if d.served_model_name else []
    return [*named, *flag_argv(d.flags)]


def secret_ref(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": name}}}


def container_env(d: Deployment, with_api_key: bool = True) -> list[dict[str, Any]]:
    """A container's `env:`: plain values as the study ran them, secrets by reference only. GPU pinning
    (CUDA_VISIBLE_DEVICES) stays out: in a pod the device plugin decides which GPUs it sees."""
    check_env_names(d.env)
    check_env_names(d.secret_env)
    env: list[dict[str, Any]] = [{"name": k, "value": k8s_escape(v)} for k, v in d.env.items()]
    names = [*([API_KEY_VAR] if with_api_key and d.needs_api_key else []), *d.secret_env]
    return env + [secret_ref(name) for name in names]


def memory_request(d: Deployment) -> str:
    offload = d.flags.get("cpu-offload-gb", 0)
    per_gpu = float(offload) if isinstance(offload, int | float) and not isinstance(offload, bool) else 0.0
    return f"{BASE_MEMORY_GIB + math.ceil(per_gpu * d.gpu_count)}Gi"


def gpu_resources(d: Deployment) -> dict[str, Any]:
    count = str(d.gpu_count)
    return {"requests": {"cpu": CPU_REQUEST, "memory": memory_request(d), GPU_RESOURCE: count},
            "limits": {GPU_RESOURCE: count}}


def _secret_lines(d: Deployment, how: str) -> list[str]:
    names = [*([API_KEY_VAR] if d.needs_api_key else []), *d.secret_env]
    if not names:
        return []
    return [f"variables the deployment supplies (names only, never values here): {', '.join(names)}", how]


def _secret_howto() -> str:
    return (f"create them as keys of one Secret: kubectl create secret generic {SECRET_NAME} "
            "--from-literal=NAME=... for each name above")


def _dump(document: Any) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def _version_note(d: Deployment) -> list[str]:
    if d.engine_version.startswith("unknown"):
        return ["the study did not record vLLM's version: pin the image tag to the one you tuned with"]
    return [f"image pinned to vLLM {d.engine_version}, the version tuned; the flags are that version's"]


# --- the formats -------------------------------------------------------------------------------------

def render_helm_values(d: Deployment) -> str:
    """Values for the vLLM production-stack chart (helm/values.schema.json): one modelSpec entry whose
    vllmConfig.extraArgs holds every option; the chart adds --host/--port and `vllm serve MODEL`."""
    repository, tag = _image(d.engine_version).rsplit(":", 1)
    spec: dict[str, Any] = {
        "name": resource_name(d),
        "annotations": certificate_annotation(d),
        "repository": repository,
        "tag": tag,
        "modelURL": d.model,
        "replicaCount": 1,
        "requestCPU": int(CPU_REQUEST),
        "requestMemory": memory_request(d),
        "requestGPU": d.gpu_count,
        "vllmConfig": {"extraArgs": [k8s_escape(a) for a in named_args(d)]},
    }
    env = container_env(d, with_api_key=False)  # the chart's own vllmApiKey sets VLLM_API_KEY
    if env:
        spec["env"] = env
    engine: dict[str, Any] = {"modelSpec": [spec]}
    if d.needs_api_key:
        engine["vllmApiKey"] = {"secretName": SECRET_NAME, "secretKey": API_KEY_VAR}
    usage = ["use: helm install vllm vllm/vllm-stack -f THIS_FILE (vLLM production-stack chart)",
             *_version_note(d), *_secret_lines(d, _secret_howto())]
    return _header(d, usage) + _dump({"servingEngineSpec": engine})


def render_kserve(d: Deployment) -> str:
    """A KServe LLMInferenceService (serving.kserve.io/v1alpha2): the model by URI, the options in
    VLLM_ADDITIONAL_ARGS, which KServe's default config appends to `vllm serve /mnt/models` through a
    shell's eval — so the value is shell-quoted, word by word."""
    model_uri = f"pvc://models{d.model}" if d.model.startswith("/") else f"hf://{d.model}"
    env = [{"name": "VLLM_ADDITIONAL_ARGS", "value": k8s_escape(shlex.join(flag_argv(d.flags)))},
           *container_env(d)]
    service = {
        "apiVersion": "serving.kserve.io/v1alpha2",
        "kind": "LLMInferenceService",
        "metadata": {"name": resource_name(d), "annotations": certificate_annotation(d)},
        "spec": {
            "model": {"uri": model_uri, "name": d.served_model_name or d.model},
            "replicas": 1,
            "template": {"containers": [{"name": "main", "image": _image(d.engine_version), "env": env,
                                         "resources": gpu_resources(d)}]},
        },
    }
    usage = ["use: kubectl apply -f THIS_FILE (KServe with the LLMInferenceService controller)",
             "spec.model.name is the served model name: KServe passes it to --served-model-name"]
    if d.model.startswith("/"):
        usage.append("the study loaded a local path: copy it onto a PVC named models, or change spec.model.uri")
    usage += [*_version_note(d), *_secret_lines(d, _secret_howto())]
    return _header(d, usage) + _dump(service)


def render_k8s_args(d: Deployment) -> str:
    """One Kubernetes container (core/v1 Container): `command: [vllm, serve]`, the model and options as
    `args:`, for a plain Deployment's pod template or llm-d's container list."""
    container = {
        "name": "vllm",
        "image": _image(d.engine_version),
        "command": ["vllm", "serve"],
        "args": [k8s_escape(a) for a in d.serve_args()],
        "env": container_env(d),
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": gpu_resources(d),
    }
    if not container["env"]:
        del container["env"]
    usage = ["use: a container of a Deployment's pod template (spec.template.spec.containers[]), or of llm-d's",
             "with llm-d's modelCommand: vllmServe, keep only the options: drop command and the first arg (the model)",
             f"the certificate as an annotation for the pod template: {CERTIFICATE_ANNOTATION} (export --format kserve "
             "carries it in full)", *_version_note(d), *_secret_lines(d, _secret_howto())]
    return _header(d, usage) + _dump(container)


def engine_kwargs(d: Deployment) -> dict[str, Any]:
    """vLLM's EngineArgs keywords: the long option's name with underscores (the spelling flag_argv reads
    back as `--name`), values typed as tuned: a boolean stays a boolean (flag_argv's --x / --no-x)."""
    kwargs: dict[str, Any] = {}
    for name, value in d.flags.items():
        (option,) = flag_argv({name: True})  # the one spelling of the option, `--name`
        kwargs[option.removeprefix("--").replace("-", "_")] = value
    return kwargs


def render_ray_serve(d: Deployment) -> str:
    """A Ray Serve config file (`serve deploy`/`serve run`) building Ray Serve LLM's OpenAI app with one
    LLMConfig: the tuned options as engine_kwargs, plain variables in runtime_env.env_vars."""
    llm_config: dict[str, Any] = {
        "model_loading_config": {"model_id": d.served_model_name or d.model, "model_source": d.model},
        "engine_kwargs": engine_kwargs(d),
        "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
    }
    check_env_names(d.env)
    if d.env:
        llm_config["runtime_env"] = {"env_vars": dict(d.env)}
    app = {"applications": [{"name": resource_name(d), "route_prefix": "/",
                             "import_path": "ray.serve.llm:build_openai_app",
                             "args": {"llm_configs": [llm_config]}}]}
    usage = ["use: serve deploy THIS_FILE (Ray Serve LLM, ray[llm])",
             f"run it with vLLM {d.engine_version} installed on the cluster, the version tuned",
             *_secret_lines(d, "Ray copies no secret from this file: set each on every node's environment "
                               "before `ray start` (workers inherit it); Ray Serve LLM does not read "
                               f"{API_KEY_VAR}, so put authentication in front of it")]
    return _header(d, usage) + _dump(app)


CLUSTER_RENDERERS: dict[str, Callable[[Deployment], str]] = {
    "helm-values": render_helm_values, "kserve": render_kserve, "k8s-args": render_k8s_args,
    "ray-serve": render_ray_serve,
}
