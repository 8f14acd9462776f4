"""`export -o` and a deploy's `config_path`: an existing file is replaced only with --force, a replaced
file never becomes more readable (new files are 0600), and a symlink is followed — the file it names is
replaced atomically, the link stays a link, and a deploy keeps `.previous` beside the link's target."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autotuner.deploy.file import FileTarget
from autotuner.deploy.spec import FileSpec
from tests.export.conftest import make_study  # noqa: F401  (the fixture)
from tests.support.studies import MakeStudy, StudyDb


def export(study: StudyDb, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotuner", "export", "--format", "yaml", "--storage", study.storage,
                           "--allow-unverified", "-o", str(out), *extra], capture_output=True, text=True, timeout=120)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_file_is_kept_without_force(make_study: MakeStudy, tmp_path: Path) -> None:  # noqa: F811
    study = make_study()
    out = tmp_path / "vllm.yaml"
    out.write_text("mine\n")
    done = export(study, out)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "exists; pass --force" in errors[0] and "Traceback" not in done.stderr
    assert out.read_text() == "mine\n"


@pytest.mark.parametrize(("before", "after"), [(None, 0o600), (0o644, 0o600), (0o400, 0o400), (0o640, 0o600)])
def test_modes(make_study: MakeStudy, tmp_path: Path, before: int | None, after: int) -> None:  # noqa: F811
    study = make_study()
    out = tmp_path / "vllm.yaml"
    if before is not None:
        out.write_text("mine\n")
        out.chmod(before)
    old_umask = os.umask(0)  # the CLI's mode does not come from a permissive umask
    try:
        done = export(study, out, "--force")
    finally:
        os.umask(old_umask)
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# autotuner certificate")
    assert mode(out) == after


def test_a_symlink_is_followed(make_study: MakeStudy, tmp_path: Path) -> None:  # noqa: F811
    study = make_study()
    (tmp_path / "srv").mkdir()
    target = tmp_path / "srv" / "vllm.yaml"
    target.write_text("mine\n")
    target.chmod(0o400)
    link = tmp_path / "vllm.yaml"
    link.symlink_to(target)
    assert export(study, link).returncode == 2  # a link to an existing file is an existing file
    done = export(study, link, "--force")
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("# autotuner certificate") and mode(target) == 0o400
    assert sorted(p.name for p in (tmp_path / "srv").iterdir()) == ["vllm.yaml"]  # no temp file left


def test_a_dangling_symlink_needs_force_and_then_creates_its_target(make_study: MakeStudy, tmp_path: Path) -> None:  # noqa: F811
    study = make_study()
    link = tmp_path / "vllm.yaml"
    link.symlink_to(tmp_path / "elsewhere.yaml")
    assert export(study, link).returncode == 2
    assert export(study, link, "--force").returncode == 0
    assert link.is_symlink() and mode(tmp_path / "elsewhere.yaml") == 0o600


def test_a_deploy_config_path_that_is_a_symlink_is_followed(tmp_path: Path) -> None:
    srv, etc = tmp_path / "srv", tmp_path / "etc"
    srv.mkdir()
    etc.mkdir()
    real = srv / "config.yaml"
    real.write_text("max-num-seqs: 8\n")
    real.chmod(0o640)
    link = etc / "config.yaml"
    link.symlink_to(real)
    target = FileTarget(FileSpec.model_validate({"kind": "file", "config_path": str(link)}))
    target.write({"max-num-seqs": 16})
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert target.current() == {"max-num-seqs": 16}
    assert (srv / "config.yaml.previous").read_text() == "max-num-seqs: 8\n"
    assert mode(real) == 0o640 and mode(srv / "config.yaml.previous") == 0o640
    assert sorted(p.name for p in etc.iterdir()) == ["config.yaml"]
    assert target.restore_previous()
    assert link.is_symlink() and target.current() == {"max-num-seqs": 8}
