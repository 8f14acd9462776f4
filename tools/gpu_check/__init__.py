"""One-shot check on a real GPU: real NVML through our monitor, the real memory wall of chunked
prefill, the real OOM path; each figure beside the simulator's prediction where it has one.

    bash tools/gpu_check.sh                             # on the device machine (installs the carried wheels)
    python3 -m tools.gpu_check --out DIR                # the same, wheels already importable
    python3 -m tools.gpu_check --dry-run --out DIR      # here: simulated NVML, torch replaced by CpuStandIn

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
Run from the repository's root (or with it on PYTHONPATH). Modules, one concept each: ``config``
(CheckConfig and the command line), ``records`` (what a step leaves), ``device`` / ``torch_cuda`` /
``stand_in`` / ``prefill`` (the GPU and what it is fed), ``gpu_access`` (how a step reaches it),
``step_nvml`` / ``step_wall`` / ``step_oom`` (the three steps), ``step_runner`` (process groups and
time boxes), ``children`` (the commands of our own child processes), ``predictions`` (the simulator's),
``fits``, ``report`` / ``markdown`` / ``plot`` (the summary) and ``cli``.
"""
