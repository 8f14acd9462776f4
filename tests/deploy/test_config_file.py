"""The live --config file: atomic writes, `.previous` kept and restored, mode kept, what vLLM reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotuner.deploy import DeployError, DeployTarget, FileSpec, make_target, parse_deploy_spec
from autotuner.deploy.base import ConfigFile
from autotuner.vllm.cmdline import config_file_argv

A = {"max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.85, "enable-chunked-prefill": True}
B = {"max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.9, "cpu-offload-gb": 4}


def file_target(tmp_path: Path):
    spec = parse_deploy_spec({"kind": "file", "config_path": str(tmp_path / "tuned.yaml")})
    assert isinstance(spec, FileSpec)
    target = make_target(spec)
    assert isinstance(target, DeployTarget)
    return target


def test_write_keeps_previous_and_restore_puts_it_back(tmp_path: Path) -> None:
    target = file_target(tmp_path)
    assert target.current() is None
    assert target.restore_previous() is False  # nothing to roll back to yet
    target.write(A)
    assert target.current() == A
    assert not (tmp_path / "tuned.yaml.previous").exists()
    target.write(B)
    assert target.current() == B
    assert ConfigFile(target.config_path).read(tmp_path / "tuned.yaml.previous") == A
    assert target.restore_previous() is True
    assert target.current() == A
    assert target.restore_previous() is True  # a repeated rollback (a resumed daemon) is the same rollback
    assert target.current() == A
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left
    # file, not a service: nothing to restart and nothing to report
    target.apply()
    assert target.is_up() is None


def test_rewriting_the_live_flags_does_not_overwrite_the_rollback_target(tmp_path: Path) -> None:
    target = file_target(tmp_path)
    target.write(A)
    target.write(B)
    target.write(B)  # e.g. a daemon killed after writing, resumed: it writes the same candidate again
    assert ConfigFile(target.config_path).read(target.config_path.with_name("tuned.yaml.previous")) == A
    target.restore_previous()
    assert target.current() == A


def test_mode_is_kept(tmp_path: Path) -> None:
    target = file_target(tmp_path)
    target.write(A)
    assert target.config_path.stat().st_mode & 0o777 == 0o644
    target.config_path.chmod(0o640)
    target.write(B)
    assert target.config_path.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "tuned.yaml.previous").stat().st_mode & 0o777 == 0o640


def test_a_failed_rename_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = file_target(tmp_path)
    target.write(A)
    before = target.config_path.read_bytes()
    real_replace = os.replace

    def failing_replace(src: str, dst: str | Path) -> None:
        if Path(dst) == target.config_path:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(DeployError, match=r"cannot write .*tuned.yaml: No space left on device"):
        target.write(B)
    assert target.config_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.yaml", "tuned.yaml.previous"]


def test_killed_while_writing_leaves_old_or_new_never_a_mix(tmp_path: Path) -> None:
    """A writer SIGKILLed at an arbitrary moment, many times: every read parses to one whole version."""
    path = tmp_path / "tuned.yaml"
    script = textwrap.dedent(f"""
        import itertools, sys
        from pathlib import Path
        from autotuner.deploy.base import ConfigFile
        f = ConfigFile(Path({str(path)!r}))
        big = {{"x-" + str(i): "v" * 200 for i in range(200)}}  # a file of ~50 kB: many write() calls
        for n in itertools.count():
            f.write({{**big, "version": n % 2}})
            if n == 1:  # both files exist from here on
                print("ready", flush=True)
    """)
    seen = set()
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.1 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for version in (path, path.with_name("tuned.yaml.previous")):
            data = ConfigFile(path).read(version)
            assert data is not None and len(data) == 201, f"attempt {attempt}: {version.name} is partial"
            assert all(v == "v" * 200 for k, v in data.items() if k != "version")
            seen.add(data["version"])
    assert seen == {0, 1}


def test_the_file_is_what_vllm_reads(tmp_path: Path) -> None:
    target = file_target(tmp_path)
    target.write({**A, "enforce-eager": False, "served-model-name": "m"})
    argv = config_file_argv(str(target.config_path))
    assert argv == ["--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.85",
                    "--enable-chunked-prefill", "--no-enforce-eager", "--served-model-name", "m"]
    assert target.config_path.read_text().startswith("# vLLM --config written by autotuner deploy")


def test_an_unreadable_live_file_is_a_clear_error(tmp_path: Path) -> None:
    target = file_target(tmp_path)
    target.config_path.write_text("- not\n- a mapping\n")
    with pytest.raises(DeployError, match="does not hold a mapping of vLLM option names; fix or remove it"):
        target.current()


def test_a_served_name_in_the_file_does_not_swallow_the_model_tag(tmp_path: Path) -> None:
    """The exporter writes served-model-name (a list option) first; vLLM inserts the file's options after
    the model tag, so `serve MODEL --config FILE` still has its model (the simulator must do the same)."""
    from autotuner.sim.args import parse_args

    target = file_target(tmp_path)
    target.write({"served-model-name": "prod", "max-model-len": 4096})
    ns = parse_args(["llama-2-7b", "--config", str(target.config_path), "--max-model-len", "2048"])
    assert ns.model_tag == "llama-2-7b" and ns.served_model_name == ["prod"]
    assert ns.max_model_len == 2048  # the command line wins
