"""The scheduler dump vLLM V1 logs when its engine dies in model execution, parsed back into lengths."""

from __future__ import annotations

from autotuner.watch.scheduler_dump import crash_steps

# vLLM 0.32's own output: `prepare_object_to_dump(SchedulerOutput(...))` (vllm/logging_utils/dump_input.py)
# run on a step of two new requests (3699 tokens; 5120 with 1024 from the prefix cache) and one decode
# (4100 computed), as `_dump_engine_exception` logs it from the engine core process.
DUMP = (
    'SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=cmpl-0-0,prompt_token_ids_len=3699,pre'
    'fill_token_ids_len=None,mm_features=[],sampling_params=SamplingParams(n=1, presence_penalty=0.0,'
    ' frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0, watermarking=None, top_p=1.0, t'
    'op_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], thinking_token_budget=No'
    'ne, include_stop_str_in_output=False, ignore_eos=False, max_tokens=256, min_tokens=0, logprobs=N'
    'one, prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, structu'
    'red_outputs=None, extra_args=None),block_ids=([1, 2, 3],),num_computed_tokens=0,lora_request=Non'
    'e,prompt_embeds_shape=None), NewRequestData(req_id=cmpl-1-0,prompt_token_ids_len=5120,prefill_to'
    'ken_ids_len=None,mm_features=[],sampling_params=SamplingParams(n=1, presence_penalty=0.0, freque'
    'ncy_penalty=0.0, repetition_penalty=1.0, temperature=1.0, watermarking=None, top_p=1.0, top_k=0,'
    ' min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], thinking_token_budget=None, inc'
    'lude_stop_str_in_output=False, ignore_eos=False, max_tokens=256, min_tokens=0, logprobs=None, pr'
    'ompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, structured_out'
    'puts=None, extra_args=None),block_ids=([1, 2, 3],),num_computed_tokens=1024,lora_request=None,pr'
    "ompt_embeds_shape=None)], scheduled_cached_reqs=CachedRequestData(req_ids=['cmpl-9-0'],resumed_r"
    'eq_ids=set(),new_token_ids_lens=[0],all_token_ids_lens={},new_block_ids=[None],num_computed_toke'
    'ns=[4100],num_output_tokens=[12]), num_scheduled_tokens={cmpl-9-0: 1, cmpl-0-0: 3699, cmpl-1-0: '
    '4096}, total_num_scheduled_tokens=7796, scheduled_spec_decode_tokens={}, scheduled_encoder_input'
    's={}, finished_req_ids=[], free_encoder_mm_hashes=[], scheduled_encoder_input_stats=null, preemp'
    'ted_req_ids=null, has_structured_output_requests=false, pending_structured_output_tokens=false, '
    'num_invalid_spec_tokens=null, kv_connector_metadata=null, has_sync_kv_loads=false, aux_output_co'
    'nnector_metadata=null, ec_connector_metadata=null, ec_manager_metadata=null, new_block_ids_to_ze'
    'ro=null, kv_cache_block_copies=null, kv_connector_block_state=null, num_spec_tokens_to_schedule='
    '0, num_common_prefix_blocks=[0])'
)
PREFIX = "(EngineCore_DP0 pid=4242) ERROR 12-02 03:28:00 [dump_input.py:79] "
LINE = PREFIX + "Dumping scheduler output for model execution: " + DUMP
HEADER = ("(EngineCore_DP0 pid=4242) ERROR 12-02 03:28:00 [dump_input.py:72] Dumping input data for V1 LLM "
          "engine (v0.32.0) with config: model='meta-llama/Llama-3.1-8B', max_seq_len=8192, ")
OOM = ("(EngineCore_DP0 pid=4242) ERROR 12-02 03:28:00 [core.py:710] torch.OutOfMemoryError: CUDA out of "
       "memory. Tried to allocate 2.00 GiB.")


def test_a_real_dump_gives_every_request_of_the_step() -> None:
    text = "\n".join(["(APIServer pid=4200) INFO 12-02 03:27:59 [loggers.py:123] Engine 000: Avg prompt ...",
                      HEADER, LINE, OOM, "Traceback (most recent call last):"])
    [step] = crash_steps(text)
    assert step.new_prompt_tokens == (3699, 5120)
    assert step.new_computed_tokens == (0, 1024)
    assert step.cached_req_ids == ("cmpl-9-0",) and step.cached_computed_tokens == (4100,)
    assert step.scheduled_tokens == {"cmpl-0-0": 3699, "cmpl-1-0": 4096, "cmpl-9-0": 1}
    assert step.total_scheduled_tokens == 7796 and step.complete
    assert step.prompt_lengths == (3699, 5120, 4101)


def test_a_truncated_dump_keeps_what_it_holds() -> None:
    # Cut inside the second request's prompt_token_ids_len (a collector's line limit, a log tail).
    cut = LINE[: LINE.index("prompt_token_ids_len=5120") + len("prompt_token_ids_len=51")]
    [step] = crash_steps(cut)
    assert step.new_prompt_tokens == (3699,) and not step.complete and step.total_scheduled_tokens is None
    # Split into pieces with other records between them, as docker's 16 KiB split and a busy log do.
    mid = LINE.index("scheduled_cached_reqs=")
    split = "\n".join([LINE[:mid], "(Worker_TP1 pid=4250) ERROR 12-02 03:28:00 [gpu_worker.py:1] worker line",
                       LINE[mid:], OOM])
    [again] = crash_steps(split)
    assert again.new_prompt_tokens == (3699, 5120) and again.total_scheduled_tokens == 7796
    # Two crashes, two steps, in log order; a dump cut before its first request is nothing.
    assert [s.new_prompt_tokens for s in crash_steps(LINE + "\n" + LINE.replace("=3699,", "=7000,"))] == [
        (3699, 5120), (7000, 5120)]
    assert crash_steps(PREFIX + "Dumping scheduler output for model execution: SchedulerOutput(sched") == []
    assert crash_steps("no dump here\n" + OOM) == []
