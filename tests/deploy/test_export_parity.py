"""With the exporter's Deployment (certificate included), the deployed file is byte for byte what
`autotuner export --format yaml` writes for the same trial: one renderer, one file format."""

from __future__ import annotations

from pathlib import Path

from autotuner.analysis.selection import select
from autotuner.deploy import make_target, parse_deploy_spec
from autotuner.export.certificate import build_certificate
from autotuner.export.exporter import run_export
from autotuner.export.formats import deployment
from autotuner.export.target import check_target
from autotuner.sim.args import parse_args
from tests.support.studies import StudyDb

POLICY = "max-throughput"


def test_deployed_file_equals_the_export(study_db: StudyDb, tmp_path: Path) -> None:
    exported = tmp_path / "export.yaml"
    assert run_export(study_db.storage, None, [], POLICY, "yaml", exported, force=False, allow_unverified=True) == 0

    selection = select(study_db.storage, None, [], POLICY)
    certificate = build_certificate(selection, check_target(selection.study, False).notes, allow_unverified=True)
    plan = deployment(selection, certificate)
    (tmp_path / "etc").mkdir()
    target = make_target(parse_deploy_spec({"kind": "file", "config_path": str(tmp_path / "etc" / "tuned.yaml")}))
    target.write(plan.flags, deployment=plan)
    assert target.config_path.read_bytes() == exported.read_bytes()
    assert target.current() == {"served-model-name": plan.served_model_name, **plan.flags}
    ns = parse_args(["llama-2-13b", "--config", str(target.config_path)])
    assert ns.max_num_batched_tokens == plan.flags["max-num-batched-tokens"]
