"""`measure --json` prints JSON on stdout, `-o FILE` writes a file, and the old `--json PATH` still
writes PATH with a deprecation note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent.parent


def _measure(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["engine"]["kind"] = "sim-virtual"
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(yaml.safe_dump(data))
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "autotuner", "measure", *[str(scenario) if a == "SC" else a
                                                                           for a in args]],
                          env=env, capture_output=True, text=True, timeout=300)


def test_json_to_stdout_and_output_to_a_file(tmp_path: Path) -> None:
    done = _measure(tmp_path, "SC", "--json", "-o", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout)
    assert printed["outcome"] == "ok" and "output_tokens_per_s" in printed["metrics"]
    assert json.loads((tmp_path / "r.json").read_text()) == printed
    assert "deprecated" not in done.stderr


def test_the_old_json_path_form_still_writes_the_file_with_a_note(tmp_path: Path) -> None:
    for args in (("SC", "--json", str(tmp_path / "a.json")), ("--json", str(tmp_path / "b.json"), "SC")):
        done = _measure(tmp_path, *args)
        assert done.returncode == 0, done.stderr[-2000:]
        path = Path(args[-1] if args[0] == "SC" else args[1])
        assert json.loads(path.read_text())["outcome"] == "ok"
        assert f"note: `--json {path}` is deprecated: use `-o {path}`" in done.stderr
        assert not done.stdout.lstrip().startswith("{")
