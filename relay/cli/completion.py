"""`relay completion bash|zsh`: tab completion of commands, options, and the
config's route and target names; and the examples `--help` shows."""

from __future__ import annotations

import argparse
import sys

from relay.cli.common import CommandError, add_config_option, read_database_command_config
from relay.store import Status

# What `relay COMMAND --help` shows under "examples:", for the daily commands.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "check": ("sudo relay check", "sudo relay check --json | jq .warnings"),
    "events": (
        "sudo relay events --status dead",
        "sudo relay events --route tilda --since yesterday",
        'sudo relay events --search "+7 999 123-45-67"',
        'sudo relay events --since "2026-12-02 09:00" --until "2026-12-02 18:00" --json',
    ),
    "rejections": ("sudo relay rejections --route tilda --since 2h",),
    "show": ("sudo relay show 1842", "sudo relay show 1842 --json | jq .body"),
    "retry": ("sudo relay retry 31", "sudo relay retry 31 32 33"),
    "skip": ("sudo relay skip 31",),
    "requeue": (
        "sudo relay requeue --target crm",
        "sudo relay requeue --route tilda --since yesterday",
        "sudo relay requeue 31 32 33",
        "sudo relay requeue --status delivered --target crm --since 2026-12-02",
    ),
    "pause": ("sudo relay pause crm",),
    "resume": ("sudo relay resume crm",),
    "stats": ("sudo relay stats", "sudo relay stats --json | jq .dead"),
    "purge": ("sudo relay purge --dry-run",),
    "resend": (
        "sudo relay resend 1842 --edit",
        "sudo relay resend 1842 --body fixed.json --target crm --yes",
    ),
    "render": ("sudo relay render tilda --body lead.txt",),
    "export": ("sudo relay export --since 2026-12-01 > leads.ndjson",),
    "backup": ("sudo relay backup /var/backups/relay-$(date +%F).db",),
    "init": ("sudo relay init /etc/relay/relay.toml --database /var/lib/relay/relay.db",),
    "completion": (
        "relay completion bash | sudo tee /etc/bash_completion.d/relay",
        "echo 'eval \"$(relay completion zsh)\"' >> ~/.zshrc",
    ),
}

NAMES = ("routes", "targets", "statuses")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "completion", help="print a bash or zsh completion script (routes and targets included)"
    )
    parser.add_argument("shell", choices=["bash", "zsh"], nargs="?")
    add_config_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="accepted as by every command: the output is a script"
    )
    # What the script asks for as you type: the config's names, one a line.
    parser.add_argument("--names", choices=NAMES, help=argparse.SUPPRESS)
    parser.set_defaults(handler=complete)


def with_examples(parser: argparse.ArgumentParser, name: str) -> None:
    lines = EXAMPLES.get(name)
    if lines:
        parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def complete(args: argparse.Namespace) -> int:
    if args.names is not None:
        print("\n".join(names(args)))
        return 0
    if args.shell is None:
        raise CommandError("completion: name the shell, bash or zsh")
    script = bash_script(args.root_parser)
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    sys.stdout.write(script)
    return 0


def names(args: argparse.Namespace) -> list[str]:
    if args.names == "statuses":
        return [s.value for s in Status]
    try:
        config = read_database_command_config(args)
    except CommandError:
        return []  # no config here: nothing to offer, and nothing to say mid-line
    return sorted(config.routes if args.names == "routes" else config.targets)


def _subcommands(root: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bash_script(root: argparse.ArgumentParser) -> str:
    """A completion function for bash (and zsh through bashcompinit), made
    from the parser itself: every command and option is the one that exists."""
    commands = _subcommands(root)
    cases = []
    for name, sub in commands.items():
        options = sorted(
            option
            for option, action in sub._option_string_actions.items()
            if option.startswith("--") and action.help != argparse.SUPPRESS
        )
        words = " ".join(options)
        positional = next(
            (a.dest for a in sub._actions if not a.option_strings and a.dest != "help"), ""
        )
        value = {"target": "targets", "route": "routes"}.get(positional)
        more = f' $(_relay_names {value} "$config")' if value else ""
        cases.append(f'        {name}) words="{words}{more}" ;;')
    return _BASH.replace("@COMMANDS@", " ".join(commands)).replace("@CASES@", "\n".join(cases))


_BASH = r"""# relay's completion for bash (zsh: through bashcompinit). Made by
# `relay completion bash`: commands, options, and the config's route and
# target names (read from the config as you type; nothing when unreadable).
_relay_names() {
    relay completion --names "$1" ${2:+--config "$2"} 2>/dev/null
}
_relay() {
    local cur prev command config words i
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=( $(compgen -W "@COMMANDS@ --help --version" -- "$cur") )
        return
    fi
    command="${COMP_WORDS[1]}"
    for ((i = 2; i < COMP_CWORD; i++)); do
        if [ "${COMP_WORDS[i]}" = "--config" ]; then config="${COMP_WORDS[i+1]}"; fi
    done
    case "$prev" in
        --route) words="$(_relay_names routes "$config")" ;;
        --target) words="$(_relay_names targets "$config")" ;;
        --status) words="$(_relay_names statuses)" ;;
        --config|--env-file|--credentials|--body) COMPREPLY=( $(compgen -f -- "$cur") ); return ;;
    esac
    if [ -n "$words" ]; then
        COMPREPLY=( $(compgen -W "$words" -- "$cur") )
        return
    fi
    case "$command" in
@CASES@
        *) words="" ;;
    esac
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
}
complete -o default -F _relay relay
"""
