"""Log lines in vLLM 0.32's format, so that a log classifier written for vLLM reads the simulator's.

    (APIServer pid=1234) INFO 11-30 08:30:01 [api_server.py:1885] message

and the scheduler dump vLLM's engine core logs when a step fails (`scheduler_output`), so that the
daemon's reader of it (autotuner/watch/scheduler_dump.py) reads the simulator's as it reads vLLM's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from autotuner.sim.core import ScheduledRequest, SimRequest


class VllmLog:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.pid = os.getpid()

    def line(self, process: str, level: str, where: str, message: str, pid: int | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        label = f"({process} pid={pid or self.pid}) {level} "
        text = "".join(label + (f"{stamp} [{where}] " if i == 0 else "") + part + "\n"
                       for i, part in enumerate(message.split("\n")))
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # like logging's handlers: a lost log reader must not kill the engine

    def api(self, message: str, where: str = "api_server.py:1885", level: str = "INFO") -> None:
        self.line("APIServer", level, where, message)

    def core(self, message: str, where: str = "core.py:93", level: str = "INFO") -> None:
        self.line("EngineCore", level, where, message)

    def worker(self, rank: int, pid: int, message: str, where: str = "gpu_worker.py:276",
               level: str = "INFO") -> None:
        self.line(f"Worker_TP{rank}", level, where, message, pid=pid)


def scheduler_output(step: Sequence[ScheduledRequest]) -> str:
    """`prepare_object_to_dump(scheduler_output)` as vLLM 0.32 prints it (vllm/logging_utils/dump_input.py,
    through NewRequestData's and CachedRequestData's anon_repr in vllm/v1/core/sched/output.py): the new
    requests with their prompt lengths, the running ones with their computed tokens, the step's counts."""
    new = [s for s in step if s.new]
    cached = [s for s in step if not s.new]
    news = ", ".join(
        f"NewRequestData(req_id={s.request.request_id},prompt_token_ids_len={s.request.prompt_len},"
        f"prefill_token_ids_len=None,mm_features=[],sampling_params={_sampling_params(s.request)},"
        f"block_ids=({s.request.blocks!r},),num_computed_tokens={s.computed},lora_request=None,"
        f"prompt_embeds_shape=None)" for s in new)
    ids = [s.request.request_id for s in cached]
    resumed = [s.request.request_id for s in cached if s.resumed]
    cached_text = (
        f"CachedRequestData(req_ids={ids!r},resumed_req_ids={set(resumed) if resumed else 'set()'},"
        f"new_token_ids_lens={[0] * len(cached)!r},all_token_ids_lens={{}},"
        f"new_block_ids={[None] * len(cached)!r},num_computed_tokens={[s.computed for s in cached]!r},"
        f"num_output_tokens={[s.request.output_len for s in cached]!r})")
    scheduled = ", ".join(f"{s.request.request_id}: {s.tokens}" for s in step)
    total = sum(s.tokens for s in step)
    return (f"SchedulerOutput(scheduled_new_reqs=[{news}], scheduled_cached_reqs={cached_text}, "
            f"num_scheduled_tokens={{{scheduled}}}, total_num_scheduled_tokens={total}, "
            "scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=[], "
            "free_encoder_mm_hashes=[], scheduled_encoder_input_stats=null, preempted_req_ids=null, "
            "has_structured_output_requests=false, pending_structured_output_tokens=false, "
            "num_invalid_spec_tokens=null, kv_connector_metadata=null, has_sync_kv_loads=false, "
            "aux_output_connector_metadata=null, ec_connector_metadata=null, ec_manager_metadata=null, "
            "new_block_ids_to_zero=null, kv_cache_block_copies=null, kv_connector_block_state=null, "
            "num_spec_tokens_to_schedule=0, num_common_prefix_blocks=[0])")


def _sampling_params(req: SimRequest) -> str:
    return (f"SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
            f"temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
            f"ignore_eos={req.stop_at >= req.max_tokens}, max_tokens={req.max_tokens}, min_tokens=0, "
            f"logprobs=None, prompt_logprobs=None, skip_special_tokens=True)")
