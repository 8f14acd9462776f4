"""One-shot check on a real GPU: real NVML through our monitor, the real memory wall of chunked
prefill, the real OOM path; each figure beside the simulator's prediction where it has one.

    bash tools/gpu_check.sh                        # on the device machine (installs the carried wheels)
    python3 tools/gpu_check.py --out DIR           # the same, wheels already importable
    python3 tools/gpu_check.py --dry-run --out DIR # here: simulated NVML, torch replaced by CpuStandIn

Steps, each in its own process group with its own time box, so that a slow or hung step is killed
and still leaves its partial figures (a step appends them to a JSON-lines file as it goes):

1. ``nvml``: the NVML backend of ``autotuner.monitor`` on the real driver: device, memory, UUID,
   processes (while this step holds 1 GiB itself), the Sampler at 100 and 200 Hz (achieved rate, CPU
   cost), the latency of one memory query.
2. ``wall``: a random-weight Llama-shaped model built with transformers on the GPU, a KV-cache tensor
   reserved as vLLM V1 reserves it (utilization x total - weights - profiled activations - non-torch),
   then chunked prefill of 3000-6000-token prompts at each token budget through SDPA with the flash
   and the math backend: per budget the rise of torch's max_memory_allocated, of reserved memory and
   of NVML's used memory above the steady footprint; a linear and a quadratic fit per backend.
3. ``oom``: a child process started through ``EngineProcess`` (own process group) grows its CUDA
   allocation toward the card's total while our Sampler watches NVML; the threshold trips and the
   group is SIGKILLed: threshold-to-kill latency, kill-to-exit, kill-to-NVML-release. Then a child
   that allocates until a real ``torch.OutOfMemoryError``; its log goes through our classifier.

The summary (``gpu_check.json``, ``gpu_check.md``) puts the simulator's prediction beside each
figure where one exists (``autotuner.sim`` with the GPU description ``tools/h200.yaml``, its total
replaced by the measured one). Bad arguments exit 2 before anything is written.

In ``--dry-run`` the NVML is ``autotuner.sim.nvml`` over a private simulated H200, and every torch
call is replaced by ``CpuStandIn``, which holds simulated GPU memory by formula and measures
nothing: the dry run checks the plumbing (arguments, steps, time boxes, summary, predictions), not
the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script: `autotuner` is the repo root's package
    sys.path.insert(0, str(ROOT))

MIB = 1 << 20
GIB = 1 << 30
STEPS = ("nvml", "wall", "oom")
BACKENDS = ("flash", "math")
DEFAULT_BOX_S = {"nvml": 45.0, "wall": 270.0, "oom": 110.0}
DEFAULT_TOTAL_S = 450.0  # the 8 minutes, less the wheel install and the start
DEFAULT_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_PROMPTS = (3000, 4000, 5000, 6000)
DEFAULT_GPU_SPEC = HERE / "h200.yaml"
SUMMARY_RESERVE_S = 8.0  # kept back from the last step for the simulator's predictions and the files
MIN_STEP_S = 5.0
JSON_NAME, MD_NAME, LOG_NAME, PLOT_NAME = "gpu_check.json", "gpu_check.md", "gpu_check.log", "gpu_check_wall.png"


class BadInputError(Exception):
    """A bad argument: one message naming it and the fix; exit 2, nothing written."""


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class CheckConfig:
    out: str
    dry_run: bool = False
    steps: tuple[str, ...] = STEPS
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    prompts: tuple[int, ...] = DEFAULT_PROMPTS
    backends: tuple[str, ...] = BACKENDS
    model: str = "llama-2-13b"
    layers: int | None = None  # a slice of the model's layers; None: all of them
    utilization: float = 0.90
    gpu_spec: str = str(DEFAULT_GPU_SPEC)
    gpu_index: int = 0
    threshold_fraction: float = 0.90
    sampler_seconds: float = 2.0
    total_s: float = DEFAULT_TOTAL_S
    box_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BOX_S))
    stall: str | None = None  # testing the time box: this step sleeps past its box once its figures are in
    seed: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CheckConfig:
        raw = json.loads(text)
        for key in ("steps", "budgets", "prompts", "backends"):
            raw[key] = tuple(raw[key])
        return cls(**raw)


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise BadInputError(f"--{what} {text!r}: give comma-separated whole numbers, e.g. 256,1024,4096") from None
    if not values or any(v <= 0 for v in values):
        raise BadInputError(f"--{what} {text!r}: give at least one number, each greater than 0")
    return values


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise BadInputError(f"--{what} {text!r}: use one or more of {', '.join(allowed)}")
    return tuple(n for n in allowed if n in names)  # the documented order, whatever was typed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "out/gpu-check",
                   help="directory for gpu_check.json/.md/.log (default: $OUT, else out/gpu-check)")
    p.add_argument("--dry-run", action="store_true",
                   help="simulated NVML and CpuStandIn instead of torch: checks the plumbing, measures nothing")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="token budgets to sweep")
    p.add_argument("--prompts", default=",".join(map(str, DEFAULT_PROMPTS)), help="prompt lengths in tokens")
    p.add_argument("--backends", default=",".join(BACKENDS), help="SDPA backends: flash, math")
    p.add_argument("--model", default="llama-2-13b", help="a simulator model preset (its shape is built)")
    p.add_argument("--layers", type=int, help="build only this many of the model's layers")
    p.add_argument("--utilization", type=float, default=0.90, help="vLLM's --gpu-memory-utilization")
    p.add_argument("--gpu-spec", default=str(DEFAULT_GPU_SPEC), help="simulator GPU preset or YAML file")
    p.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU to use")
    p.add_argument("--threshold", type=float, default=0.90, help="OOM threshold, fraction of the total")
    p.add_argument("--sampler-seconds", type=float, default=2.0, help="length of each sampler-rate run")
    p.add_argument("--total-s", type=float, default=DEFAULT_TOTAL_S, help="time for all steps together")
    p.add_argument("--box", action="append", default=[], metavar="STEP=SECONDS",
                   help="one step's time box (default " + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_BOX_S.items())
                   + ")")
    p.add_argument("--stall", choices=STEPS, help=argparse.SUPPRESS)  # tests: make a step overrun its box
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_config(argv: list[str]) -> CheckConfig:
    ns = build_parser().parse_args(argv)
    boxes = dict(DEFAULT_BOX_S)
    for item in ns.box:
        step, _, seconds = item.partition("=")
        if step not in STEPS:
            raise BadInputError(f"--box {item!r}: the step must be one of {', '.join(STEPS)}")
        try:
            boxes[step] = float(seconds)
        except ValueError:
            raise BadInputError(f"--box {item!r}: give STEP=SECONDS, e.g. wall=240") from None
        if boxes[step] <= 0:
            raise BadInputError(f"--box {item!r}: the seconds must be greater than 0")
    if not 0 < ns.utilization <= 1:
        raise BadInputError(f"--utilization {ns.utilization}: give a fraction in (0, 1], e.g. 0.9")
    if not 0 < ns.threshold < 1:
        raise BadInputError(f"--threshold {ns.threshold}: give a fraction in (0, 1), e.g. 0.9")
    if ns.layers is not None and ns.layers < 1:
        raise BadInputError(f"--layers {ns.layers}: give at least 1")
    if ns.total_s <= 0 or ns.sampler_seconds <= 0:
        raise BadInputError("--total-s and --sampler-seconds must be greater than 0")
    from autotuner.catalog.gpus import load_gpu
    from autotuner.catalog.models import load_model
    from autotuner.errors import UserInputError

    try:
        spec = load_model(ns.model)
        load_gpu(ns.gpu_spec)
    except UserInputError as exc:
        raise BadInputError(str(exc)) from None
    if ns.layers is not None and ns.layers > spec.num_layers:
        raise BadInputError(f"--layers {ns.layers}: {ns.model} has only {spec.num_layers} layers")
    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {out}: exists and is not a directory; name a directory")
    return CheckConfig(
        out=str(out), dry_run=ns.dry_run, steps=_names(ns.steps, STEPS, "steps"),
        budgets=tuple(sorted(set(_int_list(ns.budgets, "budgets")))), prompts=_int_list(ns.prompts, "prompts"),
        backends=_names(ns.backends, BACKENDS, "backends"), model=ns.model, layers=ns.layers,
        utilization=ns.utilization, gpu_spec=ns.gpu_spec, gpu_index=ns.gpu_index,
        threshold_fraction=ns.threshold, sampler_seconds=ns.sampler_seconds, total_s=ns.total_s, box_s=boxes,
        stall=ns.stall, seed=ns.seed,
    )


# ---------------------------------------------------------------------------------------------
# What a step records: JSON lines, appended and flushed as it goes, so a killed step leaves them.


class Recorder:
    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the step's life

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def set(self, key: str, value: Any) -> None:
        self._write({"set": key, "value": value})

    def add(self, table: str, row: dict[str, Any]) -> None:
        self._write({"add": table, "row": row})

    def close(self) -> None:
        self._file.close()


def read_records(path: Path) -> dict[str, Any]:
    """{"facts": {...}, "tables": {name: [rows]}}; a half-written last line (a killed step) is skipped."""
    facts: dict[str, Any] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "set" in record:
                facts[record["set"]] = record["value"]
            elif "add" in record:
                tables.setdefault(record["add"], []).append(record["row"])
    return {"facts": facts, "tables": tables}


# ---------------------------------------------------------------------------------------------
# The GPU, real (torch) or stood in for (CpuStandIn). Only these two classes touch "the device".


class DeviceOutOfMemoryError(Exception):
    """The device refused an allocation; ``message`` is the text the framework gave."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# One prefill step: (slot offset in the KV tensor, first position, new tokens) per sequence.
Chunk = tuple[int, int, int]


class Device(Protocol):
    """What the steps ask of the GPU; TorchCuda does it for real, CpuStandIn by formula."""

    label: str

    def hold(self, nbytes: int) -> None: ...  # a plain allocation; raises DeviceOutOfMemoryError
    def release_all(self) -> None: ...
    def free_bytes(self) -> tuple[int, int]: ...  # (free, total) as the framework sees them
    def oom_error_type(self) -> type[BaseException]: ...
    def versions(self) -> dict[str, str]: ...
    def memory(self) -> tuple[int, int]: ...  # (allocated, reserved) by the caching allocator
    def reset_peak(self) -> None: ...
    def peak(self) -> tuple[int, int]: ...  # (max allocated, max reserved) since reset_peak
    def empty_cache(self) -> None: ...
    def load_model(self, spec: Any, layers: int | None) -> int: ...  # weight bytes
    def reserve_kv(self, nbytes: int) -> int: ...  # KV tokens it holds
    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> Any: ...
    def attention_agreement(self) -> float: ...


def schedule_chunks(prompts: tuple[int, ...], budget: int) -> list[list[Chunk]]:
    """vLLM V1's chunked prefill of prompts that all arrive at once: each step takes up to `budget`
    tokens, first-come first-served, finishing the partly prefilled prompt before starting the next."""
    offsets = [sum(prompts[:i]) for i in range(len(prompts))]
    done = [0] * len(prompts)
    steps: list[list[Chunk]] = []
    while any(d < p for d, p in zip(done, prompts, strict=True)):
        left, step = budget, []
        for i, length in enumerate(prompts):
            n = min(length - done[i], left)
            if n <= 0:
                continue
            step.append((offsets[i], done[i], n))
            done[i] += n
            left -= n
            if left == 0:
                break
        steps.append(step)
    return steps


class TorchCuda:
    """The real device: PyTorch on CUDA, the model built by transformers with random weights."""

    label = "torch"
    dtype = "bfloat16"

    def __init__(self, index: int) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        torch.zeros(1, device=self.device)  # the CUDA context exists from here on
        self.model: Any = None
        self.kv: Any = None
        self._held: list[Any] = []

    # -- plain allocations (nvml and oom steps)
    def hold(self, nbytes: int) -> None:
        try:
            self._held.append(self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device))
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc

    def release_all(self) -> None:
        self._held.clear()
        self.torch.cuda.empty_cache()

    def free_bytes(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def oom_error_type(self) -> type[BaseException]:
        return self.torch.OutOfMemoryError

    def versions(self) -> dict[str, str]:
        import transformers

        torch = self.torch
        return {"torch": torch.__version__, "cuda": str(torch.version.cuda), "transformers": transformers.__version__,
                "device": torch.cuda.get_device_name(self.device)}

    # -- memory figures (bytes)
    def memory(self) -> tuple[int, int]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        return int(cuda.memory_allocated(self.device)), int(cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> tuple[int, int]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        return int(cuda.max_memory_allocated(self.device)), int(cuda.max_memory_reserved(self.device))

    def empty_cache(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()

    # -- the model
    def load_model(self, spec: Any, layers: int | None) -> int:
        torch = self.torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_hidden_layers=layers or spec.num_layers, num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab_size,
            max_position_embeddings=max(spec.max_position_embeddings, 32768),
            tie_word_embeddings=spec.tie_word_embeddings,
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, self.dtype))
        try:
            with torch.device(self.device):
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.eval().requires_grad_(False)
        self.model = model
        return sum(p.numel() * p.element_size() for p in model.parameters())

    def reserve_kv(self, nbytes: int) -> int:
        """One tensor [layers, 2, kv_heads, tokens, head_dim] of `nbytes` at most; its token capacity."""
        cfg = self.model.config
        per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * self.model.dtype.itemsize
        tokens = max(0, nbytes // per_token)
        try:
            self.kv = self.torch.empty(
                (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, tokens, cfg.head_dim),
                dtype=getattr(self.torch, self.dtype), device=self.device,
            )
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc
        return tokens

    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> Any:
        """Chunked prefill steps through SDPA with one backend: the last step's logits (one row per
        sequence in it); raises DeviceOutOfMemoryError."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[backend]
        logits = None
        try:
            with self.torch.inference_mode(), sdpa_kernel([chosen]):
                for chunks in steps:
                    logits = self._forward(chunks, self.kv if use_kv else None)
            self.synchronize()
        except self.torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(str(exc)) from exc
        return logits

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    @staticmethod
    def token_ids(torch: Any, chunks: list[Chunk], vocab: int, device: Any) -> Any:
        """Each prompt token's id is a function of its place, so any chunking feeds the same prompts."""
        where = torch.cat([torch.arange(o + s, o + s + n, device=device) for o, s, n in chunks])
        return ((where * 7919 + 13) % vocab).unsqueeze(0)

    def _forward(self, chunks: list[Chunk], kv: Any) -> Any:
        """One engine step: all chunks' tokens through the projections and MLPs together (as vLLM
        batches them), attention per sequence over its cached context (as vLLM's varlen kernel)."""
        torch = self.torch
        import torch.nn.functional as F  # noqa: N812
        from torch.nn.attention.bias import causal_lower_right
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        model = self.model.model
        cfg = self.model.config
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        total = sum(n for _, _, n in chunks)
        ids = self.token_ids(torch, chunks, cfg.vocab_size, self.device)
        pos = torch.cat([torch.arange(s, s + n, device=self.device) for _, s, n in chunks]).unsqueeze(0)
        h = model.embed_tokens(ids)
        # transformers ≥ 4.45 keeps one rotary embedding on the model, older ones one per attention layer
        rotary = getattr(model, "rotary_emb", None) or model.layers[0].self_attn.rotary_emb
        cos, sin = rotary(h, pos)
        for li, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, nh, hd).transpose(1, 2)
            k = attn.k_proj(x).view(1, total, nkv, hd).transpose(1, 2)
            v = attn.v_proj(x).view(1, total, nkv, hd).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs, o = [], 0
            for off, start, n in chunks:
                end = start + n
                if kv is None:  # the profile run: no cache, the chunk attends to itself
                    keys, values = k[:, :, o:o + n], v[:, :, o:o + n]
                else:
                    kv[li, 0, :, off + start:off + end] = k[0, :, o:o + n]
                    kv[li, 1, :, off + start:off + end] = v[0, :, o:o + n]
                    keys, values = kv[li, 0, :, off:off + end][None], kv[li, 1, :, off:off + end][None]
                if nkv != nh:  # the lower-right flash path takes no enable_gqa
                    keys = keys.repeat_interleave(nh // nkv, dim=1)
                    values = values.repeat_interleave(nh // nkv, dim=1)
                query = q[:, :, o:o + n]
                if keys.shape[2] == n:
                    outs.append(F.scaled_dot_product_attention(query, keys, values, is_causal=True))
                else:
                    mask = causal_lower_right(n, keys.shape[2])
                    outs.append(F.scaled_dot_product_attention(query, keys, values, attn_mask=mask))
                o += n
            a = torch.cat(outs, dim=2).transpose(1, 2).reshape(1, total, nh * hd)
            h = h + attn.o_proj(a)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = model.norm(h)
        # The sampler: float32 logits of each sequence's last token, softmax and a sort (top-p).
        last = torch.tensor(list(_ends(chunks)), device=self.device)
        logits = self.model.lm_head(h[0, last]).float()
        torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True)
        return logits

    def attention_agreement(self) -> float:
        """‖flash − math‖ / ‖math‖ for one lower-right causal chunk (1024 new over 3072 context)."""
        torch = self.torch
        import torch.nn.functional as F  # noqa: N812
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        g = torch.Generator(device=self.device).manual_seed(1)
        q = torch.randn(1, 8, 1024, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, 8, 3072, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, 8, 3072, 128, device=self.device, dtype=torch.bfloat16, generator=g)
        out = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):
            with sdpa_kernel([backend]):
                out[name] = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(1024, 3072)).float()
        ref = q.double() @ k.double().transpose(-1, -2) / math.sqrt(128)
        keep = torch.ones(1024, 3072, dtype=torch.bool, device=self.device).tril(3072 - 1024)
        exact = torch.softmax(ref.masked_fill(~keep, float("-inf")), dim=-1) @ v.double()
        err = float((out["flash"].double() - exact).norm() / exact.norm())
        return max(err, float((out["math"].double() - exact).norm() / exact.norm()))


def _ends(chunks: list[Chunk]) -> Iterator[int]:
    o = 0
    for _, _, n in chunks:
        o += n
        yield o - 1


class CpuStandIn:
    """Stands in for TorchCuda in --dry-run: holds *simulated* GPU memory (a holder file on the
    simulator's GPU, which autotuner.sim.nvml reports) by formula, like a caching allocator would.
    It measures nothing; its figures only carry the plumbing through to the summary."""

    label = "CpuStandIn (dry run: figures are a formula, not a measurement)"
    CONTEXT_BYTES = 500 * MIB

    def __init__(self, index: int) -> None:
        import psutil

        from autotuner.sim.gpu_state import GpuHost, state_dir_from_env

        self.index = index
        self.state_dir = state_dir_from_env()
        gpus = GpuHost(self.state_dir).inventory()
        if not 0 <= index < len(gpus):
            raise RuntimeError(f"no simulated GPU {index} in {self.state_dir}")
        self.total = gpus[index].memory_total_bytes
        self.create_time = psutil.Process().create_time()
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.spec: Any = None
        self.kv_tokens = 0
        self._write()

    def _write(self) -> None:
        from autotuner.sim.gpu_state import write_holder

        write_holder(self.state_dir, gpu=self.index, pid=os.getpid(), create_time=self.create_time,
                     nbytes=self.CONTEXT_BYTES + self.reserved, name="gpu_check CpuStandIn")

    def _alloc(self, nbytes: int) -> None:
        if self.allocated + nbytes > self.reserved:
            want = -(-(self.allocated + nbytes) // (2 * MIB)) * 2 * MIB
            if self.CONTEXT_BYTES + want > self.total:
                free = self.total - self.CONTEXT_BYTES - self.reserved
                raise DeviceOutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB. GPU {self.index} has a total "
                    f"capacity of {self.total / GIB:.2f} GiB of which {max(0, free) / MIB:.2f} MiB is free. "
                    "(CpuStandIn)"
                )
            self.reserved = want
            self._write()
        self.allocated += nbytes
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.max_reserved = max(self.max_reserved, self.reserved)

    def _free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def hold(self, nbytes: int) -> None:
        self._alloc(nbytes)

    def release_all(self) -> None:
        self.allocated = 0
        self.empty_cache()

    def free_bytes(self) -> tuple[int, int]:
        return self.total - self.CONTEXT_BYTES - self.reserved, self.total

    def oom_error_type(self) -> type[BaseException]:
        return DeviceOutOfMemoryError

    def versions(self) -> dict[str, str]:
        return {"stand_in": self.label}

    def memory(self) -> tuple[int, int]:
        return self.allocated, self.reserved

    def reset_peak(self) -> None:
        self.max_allocated, self.max_reserved = self.allocated, self.reserved

    def peak(self) -> tuple[int, int]:
        return self.max_allocated, self.max_reserved

    def empty_cache(self) -> None:
        self.reserved = -(-self.allocated // (2 * MIB)) * 2 * MIB
        self._write()

    def load_model(self, spec: Any, layers: int | None) -> int:
        self.spec = spec
        n_layers = layers or spec.num_layers
        weights = spec.weight_bytes - (spec.num_layers - n_layers) * spec.params_per_layer * spec.dtype_bytes
        self._alloc(weights)
        return weights

    def reserve_kv(self, nbytes: int) -> int:
        per_token = self.spec.kv_bytes_per_token(1)
        self.kv_tokens = max(0, nbytes // per_token)
        self._alloc(self.kv_tokens * per_token)
        return self.kv_tokens

    def run(self, steps: list[list[Chunk]], backend: str, use_kv: bool = True) -> None:
        m = self.spec
        for chunks in steps:
            tokens = sum(n for _, _, n in chunks)
            linear = tokens * m.dtype_bytes * (4 * m.hidden_size + 3 * m.intermediate_size)
            self._alloc(linear)
            for _, start, n in chunks:
                scores = 3 * m.num_heads * n * (start + n) * m.dtype_bytes if backend == "math" else 0
                self._alloc(scores)
                self._free(scores)
            self._free(linear)
        time.sleep(0.05)  # long enough for a 200 Hz sampler to see the reserved pool

    def attention_agreement(self) -> float:
        return 0.0


def open_device(config: CheckConfig) -> Device:
    return CpuStandIn(config.gpu_index) if config.dry_run else TorchCuda(config.gpu_index)


def open_nvml(config: CheckConfig) -> Any:
    """Our NVML monitor over the real driver, or over the simulator's GPUs in a dry run."""
    from autotuner.monitor import open_monitor

    return open_monitor("sim" if config.dry_run else "nvml", [config.gpu_index])


def nvml_module(config: CheckConfig) -> Any:
    if config.dry_run:
        from autotuner.sim import nvml as module
    else:
        import pynvml as module
    return module


# ---------------------------------------------------------------------------------------------
# Step 1: NVML through our monitor


def step_nvml(config: CheckConfig, rec: Recorder) -> None:
    import psutil

    from autotuner.monitor import Sampler

    monitor = open_nvml(config)
    with monitor:
        device = monitor.devices()[0]
        rec.set("device", {"index": device.index, "name": device.name, "uuid": device.uuid,
                           "total_bytes": device.total_bytes})
        with contextlib.suppress(Exception):
            module = nvml_module(config)
            driver = module.nvmlSystemGetDriverVersion()
            rec.set("driver", driver.decode() if isinstance(driver, bytes) else str(driver))
        rec.set("idle_used_bytes", monitor.sample()[0])
        rec.set("idle_processes", _attempt(lambda: monitor.processes(0)))

        # Query latency: one memory reading, many times.
        lat = []
        for _ in range(2000):
            t = time.perf_counter_ns()
            monitor.sample()
            lat.append(time.perf_counter_ns() - t)
        lat.sort()
        rec.set("query_latency_us", {"median": lat[len(lat) // 2] / 1e3, "p99": lat[int(len(lat) * 0.99)] / 1e3,
                                     "max": lat[-1] / 1e3, "n": len(lat)})

        me = psutil.Process()
        for hz in (100.0, 200.0):
            sampler = Sampler(monitor, hz=hz)
            cpu0, t0 = me.cpu_times(), time.perf_counter()
            sampler.start()
            time.sleep(config.sampler_seconds)
            summary = sampler.stop()
            cpu1, wall = me.cpu_times(), time.perf_counter() - t0
            cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            rec.add("sampler", {"hz": hz, "achieved_hz": summary.sample_hz, "samples": summary.samples,
                                "cpu_fraction_of_core": cpu / wall, "errors": summary.sample_errors})

        # Our own allocation as NVML sees it: the process list, and used memory, while we hold 1 GiB.
        gpu = open_device(config)
        before = monitor.sample()[0]
        gpu.hold(GIB)
        time.sleep(0.2)
        held = monitor.sample()[0]
        procs = _attempt(lambda: monitor.processes(0))
        listed = any(p == os.getpid() for p, _ in procs) if isinstance(procs, list) else None
        rec.set("hold_1gib", {"used_rise_bytes": held - before, "processes": procs, "own_pid": os.getpid(),
                              "own_pid_listed": listed})
        gpu.release_all()


def wait_idle(monitor: Any, rec: Recorder, timeout_s: float = 20.0) -> None:
    """Wait until the last step's memory is back with the driver (it frees a dead process's memory a
    little after the exit): a baseline taken before that would be the last step's footprint."""
    from autotuner.monitor import wait_until

    limit = int(0.05 * monitor.devices()[0].total_bytes)
    t = time.perf_counter()
    idle = wait_until(monitor, lambda used: used[0] < limit, timeout_s, interval_s=0.01)
    rec.set("idle_wait", {"idle": idle, "seconds": time.perf_counter() - t, "used_bytes": monitor.sample()[0]})


def _attempt(fn: Callable[[], Any]) -> Any:
    """fn's value, or {"error": ...}: a query the driver refuses (process lists in some containers)
    is a finding, not the end of the step."""
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------------------------------------
# Step 2: the memory wall


def step_wall(config: CheckConfig, rec: Recorder, deadline: float) -> None:
    from autotuner.catalog.models import load_model
    from autotuner.monitor import Sampler

    spec = load_model(config.model)
    monitor = open_nvml(config)
    with monitor:
        total = monitor.devices()[0].total_bytes
        wait_idle(monitor, rec)
        before_nvml = monitor.sample()[0]
        gpu = open_device(config)
        rec.set("versions", gpu.versions())
        with_context = monitor.sample()[0]
        rec.set("context_bytes", with_context - before_nvml - gpu.memory()[1])
        t = time.perf_counter()
        weights = gpu.load_model(spec, config.layers)
        rec.set("model", {"preset": config.model, "layers": config.layers or spec.num_layers,
                          "prompts": list(config.prompts),
                          "weights_bytes": weights, "build_s": time.perf_counter() - t})
        rec.set("attention_rel_error_flash_math_vs_fp64", _attempt(gpu.attention_agreement))
        # vLLM V1's startup: profile one forward of the largest budget, no KV cache yet.
        profile_tokens = max(config.budgets)
        allocated0, _ = gpu.memory()
        gpu.reset_peak()
        t = time.perf_counter()
        try:
            gpu.run([[(0, 0, profile_tokens)]], "flash", use_kv=False)
        except DeviceOutOfMemoryError as exc:
            rec.set("profile_oom", exc.message)
            raise
        profile_peak = gpu.peak()[0] - allocated0
        gpu.empty_cache()
        _, reserved = gpu.memory()
        used = monitor.sample()[0]
        non_torch = max(0, used - with_context - reserved)
        requested = math.ceil(config.utilization * total)
        kv_bytes = requested - weights - profile_peak - non_torch
        rec.set("startup", {"total_bytes": total, "utilization": config.utilization, "requested_bytes": requested,
                            "profile_tokens": profile_tokens, "profile_peak_bytes": profile_peak,
                            "profile_s": time.perf_counter() - t, "non_torch_bytes": non_torch,
                            "kv_bytes_planned": kv_bytes, "nvml_before_bytes": before_nvml})
        kv_tokens = gpu.reserve_kv(kv_bytes)
        gpu.empty_cache()
        steady = monitor.sample()[0]
        rec.set("steady", {"kv_tokens": kv_tokens, "nvml_used_bytes": steady, "free_bytes": total - steady,
                           "torch_allocated_bytes": gpu.memory()[0]})
        if kv_tokens < sum(config.prompts):
            raise RuntimeError(f"the KV cache holds {kv_tokens} tokens, fewer than the prompts' {sum(config.prompts)}")

        last_s = 0.0
        for backend in config.backends:
            # Warm-up: the first use of a kernel loads its module, memory NVML sees and torch does not;
            # loaded here, it stays out of the first budget's rise (and is a figure of its own).
            gpu.empty_cache()
            nvml0 = monitor.sample()[0]
            row0: dict[str, Any] = {"backend": backend}
            try:
                gpu.run(schedule_chunks((min(config.prompts), min(config.prompts)), min(config.budgets)), backend)
            except Exception as exc:
                row0["error"] = f"{type(exc).__name__}: {exc}"[:500]
            gpu.empty_cache()
            row0["nvml_rise_after_bytes"] = monitor.sample()[0] - nvml0
            rec.add("warmup", row0)
            for budget in config.budgets:
                # A run may take about as long as the last one did at a smaller budget, or longer.
                if time.time() + 2 * last_s + 2 > deadline:
                    rec.add("wall", {"backend": backend, "budget": budget, "skipped": "out of time"})
                    continue
                steps = schedule_chunks(config.prompts, budget)
                gpu.empty_cache()
                alloc0, res0 = gpu.memory()
                nvml0 = monitor.sample()[0]
                gpu.reset_peak()
                sampler = Sampler(monitor, hz=200.0)
                sampler.start()
                t = time.perf_counter()
                row: dict[str, Any] = {"backend": backend, "budget": budget, "engine_steps": len(steps)}
                try:
                    gpu.run(steps, backend)
                except DeviceOutOfMemoryError as exc:
                    row["oom"] = exc.message.splitlines()[0]
                except Exception as exc:  # no kernel for this backend, say: the other runs still count
                    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                row["seconds"] = last_s = time.perf_counter() - t
                nvml_after = monitor.sample()[0]
                summary = sampler.stop()
                max_alloc, max_res = gpu.peak()
                row.update(
                    max_allocated_bytes=max_alloc, max_reserved_bytes=max_res,
                    allocated_rise_bytes=max_alloc - alloc0, reserved_rise_bytes=max_res - res0,
                    nvml_rise_bytes=max(summary.peak_bytes[0], nvml_after) - nvml0, nvml_steady_bytes=nvml0,
                    nvml_samples=summary.samples,
                )
                rec.add("wall", row)
                gpu.empty_cache()


# ---------------------------------------------------------------------------------------------
# Step 3: the OOM path


def step_oom(config: CheckConfig, rec: Recorder, deadline: float, home: Path) -> None:
    from autotuner.engine.classify import classify
    from autotuner.engine.process import EngineProcess
    from autotuner.engine.registry import EngineRegistry
    from autotuner.monitor import Sampler, Threshold, ThresholdEvent, wait_for_release

    registry = EngineRegistry(home)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "CUDA_VISIBLE_DEVICES": str(config.gpu_index)}
    child = [sys.executable, str(Path(__file__).resolve()), "_hog", "--config-json", config.to_json()]
    monitor = open_nvml(config)
    with monitor:
        total = monitor.devices()[0].total_bytes
        wait_idle(monitor, rec)
        baseline = monitor.sample()
        tolerance = 256 * MIB

        # 3a: the threshold trips, the group is killed.
        proc = EngineProcess([*child, "--mode", "grow"], env, home / "hog-grow.log", registry)
        marks: dict[str, float] = {}

        def on_threshold(event: ThresholdEvent) -> None:
            marks["callback"] = time.perf_counter()
            marks["callback_wall"] = time.time()
            proc.kill_now()
            marks["killed"] = time.perf_counter()

        sampler = Sampler(monitor, hz=200.0, threshold=Threshold.of_total(config.threshold_fraction),
                          on_threshold=on_threshold)
        t0 = time.perf_counter()
        sampler.start()
        proc.start()
        limit = min(deadline - 20, time.time() + 60)
        while proc.returncode is None and time.time() < limit:
            time.sleep(0.001)
        exited = time.perf_counter()
        event = sampler.threshold_event
        if event is None or "killed" not in marks:
            sampler.stop()
            proc.stop(grace_s=2)
            rec.set("trip", {"tripped": False, "returncode": proc.returncode, "log_tail": proc.log_tail(20)})
            raise RuntimeError("the threshold never tripped: see the hog's log tail")
        released = wait_for_release(monitor, baseline, tolerance, timeout=30.0, interval_s=0.002)
        released_at = time.perf_counter()
        summary = sampler.stop()
        gone = proc.stop(grace_s=2)
        sample_at = t0 + event.t_s
        grow_log = (home / "hog-grow.log").read_text(errors="replace").splitlines()
        grow_lines = [line.split() for line in grow_log if line.startswith("held ")]
        # The allocation that crossed is the child's last one logged before the callback ran.
        crossing = [float(p[2]) for p in grow_lines if len(p) == 3 and float(p[2]) <= marks["callback_wall"]]
        rec.set("trip", {
            "tripped": True, "threshold_fraction": config.threshold_fraction, "limit_bytes": event.limit_bytes,
            "used_at_trip_bytes": event.used_bytes, "total_bytes": total,
            "sample_to_kill_ms": (marks["killed"] - sample_at) * 1e3,
            "callback_to_kill_ms": (marks["killed"] - marks["callback"]) * 1e3,
            "kill_to_exit_ms": (exited - marks["killed"]) * 1e3,
            "kill_to_nvml_release_ms": (released_at - marks["killed"]) * 1e3 if released else None,
            "released": released, "group_gone": gone, "peak_bytes": summary.peak_bytes[0],
            "allocation_to_detection_ms": (marks["callback_wall"] - crossing[-1]) * 1e3 if crossing else None,
            "grow_steps_logged": len(grow_lines),
        })

        # 3b: a real torch.OutOfMemoryError, its log through our classifier.
        if time.time() > deadline - 15:
            rec.set("real_oom", {"skipped": "out of time"})
            return
        proc = EngineProcess([*child, "--mode", "oom"], env, home / "hog-oom.log", registry)
        sampler = Sampler(monitor, hz=200.0)
        sampler.start()
        proc.start()
        limit = min(deadline - 5, time.time() + 60)
        while proc.returncode is None and time.time() < limit:
            time.sleep(0.005)
        summary = sampler.stop()
        rc = proc.returncode
        proc.stop(grace_s=2)
        lines = (home / "hog-oom.log").read_text(errors="replace").splitlines()
        after_ready = classify(lines, ready=True)
        oom_lines = [line for line in lines if "out of memory" in line.lower()]
        wall = [line.split() for line in lines if line.startswith("wall ")]
        rec.set("real_oom", {
            "returncode": rc, "error_line": oom_lines[-1] if oom_lines else None,
            "classified_before_ready": proc.facts.failure, "classified_after_ready": after_ready.failure,
            "reason": after_ready.reason, "nvml_peak_bytes": summary.peak_bytes[0], "total_bytes": total,
            "nvml_peak_fraction": summary.peak_bytes[0] / total,
            "held_at_wall_bytes": int(wall[-1][1]) if wall else None, "log_tail": lines[-6:],
        })


def run_hog(config: CheckConfig, mode: str) -> int:
    """The child of step 3: `grow` allocates toward the total until killed; `oom` allocates until the
    device refuses, narrows the last chunk down to 2 MiB, then lets one OutOfMemoryError escape."""
    gpu = open_device(replace(config, gpu_index=0) if not config.dry_run else config)
    free, total = gpu.free_bytes()
    held = 0
    if mode == "grow":
        chunk = GIB
        while free - chunk > 0.02 * total:
            gpu.hold(chunk)
            held += chunk
            print(f"held {held} {time.time():.6f}", flush=True)
            free, _ = gpu.free_bytes()
            time.sleep(0.01)
        print(f"stopped growing at {held} bytes, {free} free: waiting to be killed", flush=True)
        time.sleep(120)
        return 3
    chunk = 4 * GIB
    while True:
        try:
            gpu.hold(chunk)
            held += chunk
            continue
        except DeviceOutOfMemoryError as exc:
            if chunk > 2 * MIB:
                chunk //= 2
                continue
            failed = exc
        break
    free, _ = gpu.free_bytes()
    print(f"wall {held} {free} {total}", flush=True)
    if isinstance(failed.__cause__, gpu.oom_error_type()):
        raise failed.__cause__ from None  # the framework's own exception, its traceback as a server logs it
    print(f"torch.OutOfMemoryError: {failed.message}", flush=True)  # the stand-in's line, as torch prints it
    return 1


# ---------------------------------------------------------------------------------------------
# Running one step in its own process group, inside its box


def run_step_child(config: CheckConfig, step: str, results: Path, home: Path, deadline: float) -> int:
    rec = Recorder(results)
    rec.set("pid", os.getpid())
    try:
        if step == "nvml":
            step_nvml(config, rec)
        elif step == "wall":
            step_wall(config, rec, deadline)
        else:
            step_oom(config, rec, deadline, home)
        if config.stall == step:  # the time box's own test: overrun it after recording the figures
            time.sleep(3600)
    except Exception as exc:
        rec.set("error", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return 1
    finally:
        rec.close()
    return 0


@dataclass
class StepResult:
    name: str
    status: str  # ok | error | timeout | skipped
    seconds: float
    box_s: float
    facts: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]]
    note: str = ""


def run_step(config: CheckConfig, step: str, box_s: float, work: Path, log: Any) -> StepResult:
    from autotuner.engine.registry import EngineRegistry

    results = work / f"{step}.jsonl"
    home = work / f"{step}-home"
    home.mkdir(exist_ok=True)
    deadline = time.time() + box_s
    cfg_path = work / "config.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "_step", step, "--config", str(cfg_path),
            "--results", str(results), "--home", str(home), "--deadline", f"{deadline:.3f}"]
    log.write(f"=== step {step} (box {box_s:.0f} s)\n")
    log.flush()
    t = time.perf_counter()
    # CUDA numbers GPUs as NVML does (by PCI bus), so that --gpu-index names one card for both.
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    status = "ok"
    try:
        rc = proc.wait(timeout=box_s)
        if rc != 0:
            status = "error"
    except subprocess.TimeoutExpired:
        status = "timeout"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # A killed step's children (the hog) live in their own groups: stop them as a crashed tuner's are.
    EngineRegistry(home).reap_orphans(grace_s=1.0)
    seconds = time.perf_counter() - t
    records = read_records(results)
    note = records["facts"].get("error", "") if status == "error" else ""
    if status == "timeout":
        note = f"killed at its {box_s:.0f} s box; figures recorded before that are kept"
    return StepResult(step, status, seconds, box_s, records["facts"], records["tables"], note)


def setup_dry_run(work: Path, config: CheckConfig) -> None:
    """A private simulated GPU (the configured GPU description) for the dry run's NVML."""
    from autotuner.catalog.gpus import load_gpu
    from autotuner.sim.gpu_state import STATE_DIR_ENV, GpuHost, make_gpus

    gpu = load_gpu(config.gpu_spec)
    state = work / "gpus"
    GpuHost(state).ensure_inventory(make_gpus(state, gpu.product_name, gpu.memory_bytes, config.gpu_index + 1))
    os.environ[STATE_DIR_ENV] = str(state)


def run_check(config: CheckConfig) -> dict[str, Any]:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    end = started + config.total_s
    steps: list[StepResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, open(out / LOG_NAME, "w") as log:
        work = Path(tmp)
        (work / "config.json").write_text(config.to_json())
        if config.dry_run:
            setup_dry_run(work, config)
        for i, step in enumerate(config.steps):
            left = end - time.time() - SUMMARY_RESERVE_S
            # Leave each later step at least its minimum, so one overrun cannot starve the rest.
            later = len(config.steps) - i - 1
            box = min(config.box_s[step], left - later * MIN_STEP_S)
            if box < MIN_STEP_S:
                steps.append(StepResult(step, "skipped", 0.0, 0.0, {}, {}, "no time left in --total-s"))
                continue
            result = run_step(config, step, box, work, log)
            print(f"step {step}: {result.status} in {result.seconds:.1f} s {result.note}".rstrip(), flush=True)
            steps.append(result)
    report = build_report(config, steps, started)
    write_report(out, report)
    return report


# ---------------------------------------------------------------------------------------------
# The simulator's predictions


def sim_gpu(config: CheckConfig, total_bytes: int | None) -> Any:
    from autotuner.catalog.gpus import GIB as SIM_GIB
    from autotuner.catalog.gpus import load_gpu

    gpu = load_gpu(config.gpu_spec)
    return replace(gpu, memory_gib=total_bytes / SIM_GIB) if total_bytes else gpu


def sim_config(config: CheckConfig, budget: int, total_bytes: int | None) -> Any:
    from autotuner.sim.args import build_config, parse_args

    max_len = max(8192, max(config.prompts) + 16)
    argv = [config.model, "--gpu-memory-utilization", str(config.utilization), "--max-num-batched-tokens",
            str(budget), "--max-model-len", str(max_len), "--no-enable-prefix-caching", "--sim-gpu", config.gpu_spec,
            "--max-num-seqs", str(min(256, budget))]
    engine = build_config(parse_args(argv), env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    return replace(engine, sim=replace(engine.sim, gpu=sim_gpu(config, total_bytes)))


def sim_predictions(config: CheckConfig, total_bytes: int | None) -> dict[str, Any]:
    """What autotuner.sim says for the same model, GPU, utilization, budgets and prompts. Each
    part is guarded: the simulator's memory model changes, and one failing part must not hide the rest."""
    out: dict[str, Any] = {"errors": []}

    def guarded(key: str, fn: Callable[[], Any]) -> None:
        try:
            out[key] = fn()
        except Exception as exc:
            out["errors"].append(f"{key}: {type(exc).__name__}: {exc}")

    def startup() -> dict[str, Any]:
        from autotuner.sim import memory
        from autotuner.sim.memory import plan_startup

        plan = plan_startup(sim_config(config, max(config.budgets), total_bytes))
        return {"context_bytes": getattr(memory, "CUDA_CONTEXT_BYTES", None), "weights_bytes": plan.weights_bytes,
                "profile_peak_bytes": plan.activation_peak_bytes,
                "non_torch_bytes": plan.non_torch_bytes, "kv_bytes": plan.kv_cache_bytes,
                "kv_tokens": plan.kv_cache_tokens, "steady_bytes": plan.steady_bytes,
                "requested_bytes": plan.requested_bytes}

    def transients() -> dict[str, Any]:
        from autotuner.sim.evaluate import EvalRequest, evaluate
        from autotuner.sim.memory import plan_startup

        rng = random.Random(config.seed)
        per_budget: dict[str, Any] = {}
        for budget in config.budgets:
            engine = sim_config(config, budget, total_bytes)
            vocab = engine.model.vocab_size
            requests = [EvalRequest([rng.randrange(vocab) for _ in range(n)], 1, True, 0.0) for n in config.prompts]
            ev = evaluate(engine, requests, None)
            if ev.outcome == "startup-failed":
                per_budget[str(budget)] = {"outcome": ev.outcome, "reason": ev.reason}
                continue
            steady = plan_startup(engine).steady_bytes
            peak = ev.memory.get("peak_bytes", [steady])
            per_budget[str(budget)] = {"outcome": ev.outcome, "transient_bytes": max(peak) - steady,
                                       "reason": ev.reason}
        return per_budget

    def oom_text() -> dict[str, Any]:
        from autotuner.engine.classify import classify
        from autotuner.sim.memory import oom_message

        total = total_bytes or sim_gpu(config, None).memory_bytes
        message = oom_message(2 * MIB, total, total - MIB, total - 2 * GIB)
        return {"message": message, "classified_after_ready": classify([message], ready=True).failure}

    def constants() -> dict[str, Any]:
        from autotuner.monitor.sampler import DEFAULT_FRACTION
        from autotuner.sim.gpu_state import RELEASE_DELAY_S

        return {"release_delay_s": RELEASE_DELAY_S, "threshold_default_fraction": DEFAULT_FRACTION}

    guarded("gpu", lambda: asdict(sim_gpu(config, total_bytes)))
    guarded("startup", startup)
    guarded("transient", transients)
    guarded("oom", oom_text)
    guarded("constants", constants)
    return out


# ---------------------------------------------------------------------------------------------
# Fits and the report


def fit_curve(budgets: list[int], values: list[float]) -> dict[str, Any] | None:
    """Least-squares line and parabola of transient bytes over budget tokens; None with < 3 points."""
    if len(budgets) < 3:
        return None
    import numpy as np

    x = np.asarray(budgets, dtype=float)
    y = np.asarray(values, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    curv, b1, b0 = np.polyfit(x, y, 2)
    residual = y - (slope * x + intercept)
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / spread if spread > 0 else 1.0
    top = float(x.max())
    quad_at_top = float(curv * top * top)
    y_top = float(curv * top * top + b1 * top + b0)
    share = abs(quad_at_top) / abs(y_top) if y_top else 0.0
    return {
        "slope_bytes_per_token": float(slope), "intercept_bytes": float(intercept), "linear_r2": r2,
        "quadratic": {"c2_bytes_per_token2": float(curv), "c1_bytes_per_token": float(b1), "c0_bytes": float(b0)},
        "quadratic_share_at_max": share, "verdict": "linear" if share < 0.10 and r2 > 0.98 else "not linear",
    }


def build_report(config: CheckConfig, steps: list[StepResult], started: float) -> dict[str, Any]:
    by = {s.name: s for s in steps}
    total = None
    for name in ("nvml", "wall", "oom"):
        facts = by[name].facts if name in by else {}
        total = total or (facts.get("device") or {}).get("total_bytes") or (facts.get("startup") or {}).get(
            "total_bytes") or (facts.get("trip") or {}).get("total_bytes")
    predictions = sim_predictions(config, total)
    fits: dict[str, Any] = {}
    rows = by["wall"].tables.get("wall", []) if "wall" in by else []
    for backend in config.backends:
        ok = [r for r in rows if r.get("backend") == backend and not {"oom", "skipped", "error"} & set(r)]
        for metric in ("allocated_rise_bytes", "nvml_rise_bytes"):
            fit = fit_curve([r["budget"] for r in ok], [r[metric] for r in ok])
            if fit is not None:
                fits[f"{backend}/{metric}"] = fit
    sim_rows = predictions.get("transient") or {}
    sim_ok = [(int(b), v["transient_bytes"]) for b, v in sim_rows.items() if v.get("outcome") == "ok"]
    sim_fit = fit_curve([b for b, _ in sim_ok], [v for _, v in sim_ok])
    if sim_fit is not None:
        fits["simulator/transient_bytes"] = sim_fit
    return {
        "dry_run": config.dry_run,
        "measured_by": CpuStandIn.label if config.dry_run else "real GPU (torch, NVML)",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
        "config": asdict(config),
        "steps": {s.name: asdict(s) for s in steps},
        "simulator": predictions,
        "fits": fits,
    }


def _gib(n: float | None) -> str:
    return "—" if n is None else f"{n / GIB:.2f} GiB"


def _mib(n: float | None) -> str:
    return "—" if n is None else f"{n / MIB:.0f} MiB"


def _ms(n: float | None) -> str:
    return "—" if n is None else f"{n:.1f} ms"


def render_markdown(report: dict[str, Any]) -> str:
    steps = report["steps"]
    sim = report["simulator"]
    facts = {name: s["facts"] for name, s in steps.items()}
    lines = [f"# GPU check, {report['started_utc']}", ""]
    if report["dry_run"]:
        lines += ["**Dry run**: simulated NVML and CpuStandIn in place of torch. The figures below are "
                  "formulas carried through the plumbing, not measurements.", ""]
    lines += ["| step | status | seconds | box | note |", "| --- | --- | --- | --- | --- |"]
    for name, s in steps.items():
        lines.append(f"| {name} | {s['status']} | {s['seconds']:.1f} | {s['box_s']:.0f} | {s['note']} |")
    lines.append("")

    if "nvml" in facts:
        f = facts["nvml"]
        dev = f.get("device") or {}
        gpu = sim.get("gpu") or {}
        lat = f.get("query_latency_us") or {}
        hold = f.get("hold_1gib") or {}
        lines += ["## 1. NVML through our monitor", "", "| figure | measured | simulator |", "| --- | --- | --- |",
                  f"| device | {dev.get('name', '—')} | {gpu.get('product_name', '—')} |",
                  f"| total memory | {_gib(dev.get('total_bytes'))} | "
                  f"{gpu.get('memory_gib', 0):.2f} GiB (set to the measured total) |",
                  f"| UUID | {dev.get('uuid', '—')} | — |",
                  f"| driver | {f.get('driver', '—')} | — |",
                  f"| used while idle | {_mib(f.get('idle_used_bytes'))} | — |",
                  f"| processes while idle | {f.get('idle_processes', '—')} | — |",
                  f"| one memory query (median / p99 / max) | {lat.get('median', 0):.1f} / {lat.get('p99', 0):.1f} / "
                  f"{lat.get('max', 0):.1f} µs | — |",
                  f"| holding 1 GiB: NVML used rises by | {_mib(hold.get('used_rise_bytes'))} | 1024 MiB |",
                  f"| holding 1 GiB: our PID in NVML's process list | {hold.get('own_pid_listed', '—')} "
                  f"({hold.get('processes', '—')}) | True |"]
        for row in (steps["nvml"]["tables"].get("sampler") or []):
            lines.append(f"| Sampler at {row['hz']:.0f} Hz: achieved, CPU | {row['achieved_hz']:.1f} Hz, "
                         f"{100 * row['cpu_fraction_of_core']:.1f} % of a core, {row['errors']} errors | — |")
        lines.append("")

    if "wall" in facts:
        lines += _wall_markdown(steps["wall"], sim, report["fits"])

    if "oom" in facts:
        f = facts["oom"]
        trip = f.get("trip") or {}
        real = f.get("real_oom") or {}
        const = sim.get("constants") or {}
        sim_oom = sim.get("oom") or {}
        idle = f.get("idle_wait") or {}
        lines += ["## 3. The OOM path", "", "| figure | measured | simulator |", "| --- | --- | --- |",
                  f"| GPU idle before the baseline | {idle.get('idle', '—')}, "
                  f"{_mib(idle.get('used_bytes'))} used | — |",
                  f"| threshold tripped (at {trip.get('threshold_fraction', '—')} of total) | "
                  f"{trip.get('tripped', '—')}, used {_gib(trip.get('used_at_trip_bytes'))} | — |",
                  f"| child's allocation → threshold callback | {_ms(trip.get('allocation_to_detection_ms'))} | — |",
                  f"| sample → SIGKILL sent | {_ms(trip.get('sample_to_kill_ms'))} | — |",
                  f"| SIGKILL → child exited | {_ms(trip.get('kill_to_exit_ms'))} | — |",
                  f"| SIGKILL → NVML back at baseline | {_ms(trip.get('kill_to_nvml_release_ms'))} | "
                  f"{1000 * const.get('release_delay_s', float('nan')):.0f} ms (release delay) |",
                  f"| process group gone | {trip.get('group_gone', '—')} | True |",
                  f"| NVML peak at the real OOM, share of total | "
                  f"{100 * real.get('nvml_peak_fraction', float('nan')):.2f} % | "
                  f"threshold default {100 * const.get('threshold_default_fraction', float('nan')):.0f} % |",
                  f"| classifier on the real OOM log (after ready / before) | {real.get('classified_after_ready', '—')}"
                  f" / {real.get('classified_before_ready', '—')} | {sim_oom.get('classified_after_ready', '—')} |",
                  "", "Real OOM line:", "", f"    {real.get('error_line', '—')}", "",
                  "Simulator's OOM line:", "", f"    {sim_oom.get('message', '—')}", ""]
    if sim.get("errors"):
        lines += ["Simulator predictions that failed:", ""] + [f"- {e}" for e in sim["errors"]] + [""]
    return "\n".join(lines)


def _wall_markdown(step: dict[str, Any], sim: dict[str, Any], fits: dict[str, Any]) -> list[str]:
    f = step["facts"]
    start = f.get("startup") or {}
    steady = f.get("steady") or {}
    model = f.get("model") or {}
    plan = sim.get("startup") or {}
    idle = f.get("idle_wait") or {}
    lines = ["## 2. The memory wall", "", f"Versions: {f.get('versions', '—')}. GPU idle before the baseline: "
             f"{idle.get('idle', '—')} (waited {idle.get('seconds', 0):.1f} s, "
             f"{_mib(idle.get('used_bytes'))} used).", "",
             f"Model: {model.get('preset', '—')} shape, {model.get('layers', '—')} layers, random bf16 weights "
             f"(built in {model.get('build_s', 0):.1f} s); prompts of {model.get('prompts', '—')} tokens, all arriving "
             "at once, prefilled in chunks of at most the budget per engine step.", "",
             "flash and math against float64 attention, worst relative error: "
             f"{f.get('attention_rel_error_flash_math_vs_fp64', '—')}",
             "", "| startup figure | measured | simulator |", "| --- | --- | --- |",
             f"| weights | {_gib(model.get('weights_bytes'))} | {_gib(plan.get('weights_bytes'))} |",
             f"| profiled activations ({start.get('profile_tokens', '—')} tokens) | "
             f"{_gib(start.get('profile_peak_bytes'))} | {_gib(plan.get('profile_peak_bytes'))} |",
             f"| CUDA context | {_gib(f.get('context_bytes'))} | {_gib(plan.get('context_bytes'))} |",
             f"| non-torch memory | {_gib(start.get('non_torch_bytes'))} | {_gib(plan.get('non_torch_bytes'))} |",
             f"| KV cache | {_gib(start.get('kv_bytes_planned'))}, {steady.get('kv_tokens', '—')} tokens | "
             f"{_gib(plan.get('kv_bytes'))}, {plan.get('kv_tokens', '—')} tokens |",
             f"| steady NVML footprint | {_gib(steady.get('nvml_used_bytes'))} | {_gib(plan.get('steady_bytes'))} |",
             *(f"| left after a {w['backend']} warm-up (modules loaded, cache emptied) | "
               f"{_mib(w.get('nvml_rise_after_bytes'))} {w.get('error', '')} | — |"
               for w in step["tables"].get("warmup", [])),
             "", "Transient above the steady footprint, per token budget (MiB):", "",
             "| budget | backend | steps | max_allocated rise | reserved rise | NVML rise | seconds | simulator |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    sim_rows = sim.get("transient") or {}
    for row in step["tables"].get("wall", []):
        pred = sim_rows.get(str(row["budget"])) or {}
        predicted = _mib(pred.get("transient_bytes")) if pred.get("outcome") == "ok" else pred.get("outcome", "—")
        if "skipped" in row:
            lines.append(f"| {row['budget']} | {row['backend']} | — | skipped: {row['skipped']} | | | | {predicted} |")
            continue
        oom = f" OOM: {row['oom']}" if "oom" in row else (f" error: {row['error']}" if "error" in row else "")
        lines.append(f"| {row['budget']} | {row['backend']} | {row.get('engine_steps', '—')} | "
                     f"{_mib(row.get('allocated_rise_bytes'))}{oom} | {_mib(row.get('reserved_rise_bytes'))} | "
                     f"{_mib(row.get('nvml_rise_bytes'))} | {row.get('seconds', 0):.2f} | {predicted} |")
    lines += ["", "Fits of transient bytes over budget tokens (y = c0 + c1·B + c2·B²; linear: y = a + s·B):", "",
              "| curve | slope s (KiB/token) | linear R² | c2 (bytes/token²) | quadratic share at max | verdict |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name, fit in fits.items():
        lines.append(f"| {name} | {fit['slope_bytes_per_token'] / 1024:.1f} | {fit['linear_r2']:.4f} | "
                     f"{fit['quadratic']['c2_bytes_per_token2']:.4g} | {100 * fit['quadratic_share_at_max']:.1f} % | "
                     f"{fit['verdict']} |")
    lines.append("")
    return lines


def write_report(out: Path, report: dict[str, Any]) -> None:
    """The JSON, the Markdown and, where matplotlib works, the curve; each written whole then renamed."""
    for name, text in ((JSON_NAME, json.dumps(report, indent=2, default=str)), (MD_NAME, render_markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
    with contextlib.suppress(Exception):
        plot_wall(out / PLOT_NAME, report)


def plot_wall(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["steps"].get("wall", {}).get("tables", {}).get("wall", [])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend in BACKENDS:
        ok = [r for r in rows if r.get("backend") == backend and "nvml_rise_bytes" in r
              and not {"oom", "error"} & set(r)]
        if ok:
            ax.plot([r["budget"] for r in ok], [r["nvml_rise_bytes"] / GIB for r in ok], "o-",
                    label=f"{backend} (NVML)")
    sim = report["simulator"].get("transient") or {}
    pts = sorted((int(b), v["transient_bytes"] / GIB) for b, v in sim.items() if v.get("outcome") == "ok")
    if pts:
        ax.plot([b for b, _ in pts], [v for _, v in pts], "k--", label="simulator")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_num_batched_tokens")
    ax.set_ylabel("transient above steady (GiB)")
    ax.set_title("Memory wall: transient vs budget" + (" (dry run)" if report["dry_run"] else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_step":
        p = argparse.ArgumentParser(prog="gpu_check.py _step")
        p.add_argument("step", choices=STEPS)
        for flag in ("--config", "--results", "--home", "--deadline"):
            p.add_argument(flag, required=True)
        ns = p.parse_args(argv[1:])
        config = CheckConfig.from_json(Path(ns.config).read_text())
        return run_step_child(config, ns.step, Path(ns.results), Path(ns.home), float(ns.deadline))
    if argv and argv[0] == "_hog":
        p = argparse.ArgumentParser(prog="gpu_check.py _hog")
        p.add_argument("--config-json", required=True)
        p.add_argument("--mode", choices=("grow", "oom"), required=True)
        ns = p.parse_args(argv[1:])
        return run_hog(CheckConfig.from_json(ns.config_json), ns.mode)
    try:
        config = parse_config(argv)
    except BadInputError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    report = run_check(config)
    print(render_markdown(report))
    print(f"\nwritten: {Path(config.out) / JSON_NAME}, {Path(config.out) / MD_NAME}, {Path(config.out) / LOG_NAME}")
    bad = [s["name"] for s in report["steps"].values() if s["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
