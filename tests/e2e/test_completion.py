"""Tab completion and --help examples: `relay completion bash` run by bash
itself, with the config's route and target names offered as you type."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli import parser
from relay.cli.completion import EXAMPLES

from helpers import relay_cli, write_config

BIN = Path(sys.executable).parent  # where the venv put the `relay` command


def completions(script: Path, words: list[str], config: Path, shell: str = "bash") -> list[str]:
    """What the completion function offers for the last of `words` (bash's COMP_* protocol)."""
    line = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n"
        '_relay\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        [shell, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RELAY_CONFIG": str(config)},
    )
    return [line for line in done.stdout.splitlines() if line]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "targets": {
                "crm": {"type": "http", "url": "http://127.0.0.1:9/"},
                "chat": {"type": "file", "path": "chat.jsonl"},
            },
            "routes": {
                "tilda": {"path": "/hooks/tilda", "targets": ["crm"]},
                "tbank": {"path": "/hooks/tbank", "targets": ["chat"]},
            },
        },
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_options_and_the_configs_names(
    config: Path, tmp_path: Path
) -> None:
    script = tmp_path / "relay.bash"
    script.write_text(relay_cli("completion", "bash").stdout)
    assert completions(script, ["relay", "req"], config) == ["requeue"]
    assert completions(script, ["relay", "events", "--ro"], config) == ["--route"]
    assert completions(script, ["relay", "events", "--route", "t"], config) == ["tbank", "tilda"]
    assert completions(script, ["relay", "requeue", "--target", ""], config) == ["chat", "crm"]
    assert completions(script, ["relay", "pause", "c"], config) == ["chat", "crm"]
    statuses = completions(script, ["relay", "events", "--status", "de"], config)
    assert sorted(statuses) == ["dead", "delivered"]
    assert "--names" not in completions(script, ["relay", "completion", "--"], config)


def test_the_daily_commands_show_examples_in_their_help() -> None:
    for name in ("events", "requeue", "resend", "show", "pause", "export", "check"):
        shown = relay_cli(name, "--help").stdout
        assert "\nexamples:\n" in shown, name
        assert all(example in shown for example in EXAMPLES[name]), name
    commands = next(a for a in parser()._actions if a.choices and "events" in a.choices)
    assert set(EXAMPLES) <= set(commands.choices)  # no example of a command that is not
