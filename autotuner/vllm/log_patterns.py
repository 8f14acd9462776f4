"""Lines vLLM (0.32) prints when CUDA runs out of memory, and the scheduler dump it prints when the engine
core dies in model execution, as regular expressions and templates.

The engine log classifier (autotuner/engine/classify.py), the production watcher (autotuner/watch/oom.py,
autotuner/watch/scheduler_dump.py) and the simulator that writes the same lines read vLLM's words from here.
"""

from __future__ import annotations

import re

# A step's allocation failed (runtime or profiling): the engine core dies with this exception.
TORCH_OOM = r"(torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError): CUDA out of memory\..*"
# The old model runner's sampler warm-up at startup.
SAMPLER_WARMUP_OOM = r"CUDA out of memory occurred when warming up sampler.*"

CUDA_OOM = re.compile(f"{TORCH_OOM}|{SAMPLER_WARMUP_OOM}")

# When model execution raises, V1's engine core logs the step it was running before the traceback
# (vllm/v1/engine/core.py `log_error_detail` → vllm/logging_utils/dump_input.py `_dump_engine_exception`):
#   Dumping input data for V1 LLM engine (v0.32.0) with config: <VllmConfig>,
#   Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[NewRequestData(
#     req_id=cmpl-…-0,prompt_token_ids_len=3699,prefill_token_ids_len=None,mm_features=[],sampling_params=
#     SamplingParams(…),block_ids=([…],),num_computed_tokens=0,lora_request=None,prompt_embeds_shape=None), …],
#     scheduled_cached_reqs=CachedRequestData(req_ids=['cmpl-…-0'],resumed_req_ids=set(),new_token_ids_lens=[…],
#     all_token_ids_lens={…},new_block_ids=[…],num_computed_tokens=[4100],num_output_tokens=[12]),
#     num_scheduled_tokens={cmpl-…-0: 3699, …}, total_num_scheduled_tokens=8192, …)
#   Dumping scheduler stats: SchedulerStats(…)
# One log record each (one line unless a log collector splits it). NewRequestData and CachedRequestData
# print through their anon_repr (vllm/v1/core/sched/output.py): lengths, never token ids.
DUMP_INPUT_HEADER = "Dumping input data for V1 LLM engine (v{version}) with config: {config}, "
SCHEDULER_DUMP = "Dumping scheduler output for model execution: "
SCHEDULER_STATS_DUMP = "Dumping scheduler stats: "
DUMP_WHERE = ("dump_input.py:72", "dump_input.py:79", "dump_input.py:81")  # the three lines' [file:line]
# One new request; the `,` after the number says it was not cut by a truncated line.
DUMP_NEW_REQUEST = re.compile(r"NewRequestData\(req_id=(?P<req_id>[^,]*),prompt_token_ids_len=(?P<prompt>\d+|None),")
DUMP_NEW_COMPUTED = re.compile(r",num_computed_tokens=(?P<n>\d+),")
DUMP_CACHED = re.compile(r"scheduled_cached_reqs=CachedRequestData\(req_ids=\[(?P<ids>[^\]]*)\],")
DUMP_CACHED_COMPUTED = re.compile(r",num_computed_tokens=\[(?P<n>[\d, ]*)\]")
DUMP_NUM_SCHEDULED = re.compile(r"num_scheduled_tokens=\{(?P<m>[^}]*)\}")
DUMP_TOTAL_SCHEDULED = re.compile(r"total_num_scheduled_tokens=(?P<n>\d+)")
