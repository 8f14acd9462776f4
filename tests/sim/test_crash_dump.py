"""The simulator's engine, dying of a run-time OOM, logs vLLM V1's dump of the failed step: the prompt lengths
it held, in the shape autotuner/watch/scheduler_dump.py reads from a real vLLM."""

from __future__ import annotations

import concurrent.futures

import httpx

from autotuner.daemon.config import TriggerSettings
from autotuner.daemon.triggers import OOM, TriggerWatch
from autotuner.scenario import Scenario
from autotuner.sim.args import build_config, parse_args
from autotuner.sim.core import EngineCore, SimRequest
from autotuner.sim.memory import plan_startup
from autotuner.sim.vllm_log import scheduler_output
from autotuner.watch.scheduler_dump import crash_steps
from autotuner.watch.snapshot import ProductionSnapshot
from tests.support.daemon import SCENARIO
from tests.support.waiting import wait_for

SEED = ["llama-2-13b", "-tp", "8", "--max-model-len", "8192", "--sim-noise", "0"]
# One unchunked prefill step of ~5000 tokens needs more unprofiled memory than util 0.96 leaves (sim/memory.py).
TIGHT = ["--gpu-memory-utilization", "0.96", "--no-enable-chunked-prefill"]


def test_the_failed_step_is_dumped_with_the_lengths_it_scheduled() -> None:
    config = build_config(parse_args([*SEED, *TIGHT]), env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    core = EngineCore(config, plan_startup(config))
    # A short request decoding when three long prompts arrive together: they are prefilled in one step.
    first = SimRequest("cmpl-first-0", [7] * 300, 64, 0.0, 64)
    core.add_request(first)
    result = core.step(0.0)
    assert result.oom is None
    for i, n in enumerate((2400, 1800, 1500)):
        core.add_request(SimRequest(f"cmpl-long{i}-0", [i + 1] * n, 64, 0.1, 64))
    result = core.step(result.end)
    assert result.oom is not None, "the step of 5701 tokens should not fit"
    [step] = crash_steps("ERROR [dump_input.py:79] Dumping scheduler output for model execution: "
                         + scheduler_output(result.oom.step))
    assert step.new_prompt_tokens == (2400, 1800, 1500) and step.new_computed_tokens == (0, 0, 0)
    assert step.cached_req_ids == ("cmpl-first-0",) and step.cached_computed_tokens == (300,)
    assert step.total_scheduled_tokens == 2400 + 1800 + 1500 + 1 and step.complete
    assert step.prompt_lengths == (2400, 1800, 1500, 301)


def test_a_served_engine_logs_the_dump_before_the_oom(sim_server) -> None:
    server = sim_server.start([*SEED, *TIGHT, "--sim-speedup", "100"])
    watch = TriggerWatch(TriggerSettings(workload_drift=None), server.log_path)  # as the daemon reads production
    sizes = (5000, 3000)

    def send(n: int) -> int:
        # Token ids of their own: no prefix-cache hit on the other prompt shortens the long prefill.
        body = {"prompt": [(n + i) % 30000 for i in range(n)], "max_tokens": 16, "ignore_eos": True}
        return httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(send, sizes))
    assert 500 in codes, codes
    assert wait_for(lambda: "CUDA out of memory" in server.log(), timeout=10), server.log()[-2000:]
    log = server.log()
    steps = crash_steps(log)
    assert len(steps) == 1 and steps[0].complete, log[-3000:]
    # Whichever of the two the failed step held, it held the 5000-token one with its exact length.
    assert 5000 in steps[0].prompt_lengths and set(steps[0].new_prompt_tokens) <= set(sizes)
    assert log.index("Dumping scheduler output for model execution") < log.index("torch.OutOfMemoryError")
    assert "[dump_input.py:79] Dumping scheduler output" in log  # written where vLLM writes it
    # The daemon's OOM trigger carries them.
    down = ProductionSnapshot(0.0, server.url, False, "refused", None, None, None, None, None, None, None, None,
                              None, None)
    [fired] = watch.observe(down, (), None, Scenario.model_validate(SCENARIO), None)
    assert fired.kind == OOM and 5000 in fired.evidence["crash_prompts"]
