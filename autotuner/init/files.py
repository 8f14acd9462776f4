"""The two files `init` writes, as text: the scenario and the daemon config, with the comments a person
reads first, and the proof that each says only what was meant (what an endpoint says is data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotuner.errors import UserInputError
from autotuner.export.formats import one_line  # text from an endpoint stays inside its comment


def scenario_yaml(data: dict[str, Any], title: str, check: list[str]) -> str:
    head = [f"# {one_line(title)}"]
    if check:
        head.append("# Check before running:")
        head += [f"#  - {one_line(line)}" for line in check]
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)
    return "\n".join(head) + "\n" + body


# Comments written above the daemon config's keys: what each does, where it is not obvious.
_DAEMON_COMMENTS = {
    "window": ["Re-tunes start and run only inside this daily window (local time). A production crash or OOM",
               "outside it is mitigated at once; only the re-tune waits for the window."],
    "max_downtime": ["The most one cycle may keep production down (tune, confirm, soak and restart): the cycle",
                     "plans its trials, confirmation and soak to fit, and stops early with the best verified so far."],
    "approve": ["manual: a cycle stops at `proposed` with its evidence; `autotuner daemon approve CONFIG CYCLE`",
                "deploys it (or `reject`)."],
}
_FILE_TARGET_HINT = [
    "  # Without stop and start the daemon cannot take production down, so it cannot tune on production's",
    "  # GPUs; give both (argv lists that run to completion), e.g.:",
    "  # stop: [systemctl, stop, vllm]",
    "  # start: [systemctl, start, vllm]",
]


def daemon_yaml(data: dict[str, Any], title: str) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)
    lines: list[str] = []
    previous = None
    for line in body.splitlines():
        if not line.startswith(" "):
            key = line.split(":", 1)[0]
            if previous == "deploy" and data["deploy"]["kind"] == "file":
                lines += _FILE_TARGET_HINT  # at the end of the deploy section
            lines += [f"# {c}" for c in _DAEMON_COMMENTS.get(key, [])]
            previous = key
        lines.append(line)
    return f"# {one_line(title)}\n" + "\n".join(lines) + "\n"


def loads_back(text: str, meant: dict[str, Any], path: Path) -> str:
    """The file says what was meant and nothing else. What an endpoint says (a model's `root`, its id, its
    version) is data that lands in values and comments; should any of it still change what the YAML
    holds, nothing is written."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        loaded = exc
    if loaded != meant:
        raise UserInputError(f"{path.name}: what the endpoint or command line says would change the file's "
                             "meaning (a value with line breaks or YAML syntax); nothing written. Check the "
                             "endpoint's /v1/models answer, or write the scenario by hand")
    return text
