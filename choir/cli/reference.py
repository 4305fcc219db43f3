"""`.env.example` and the settings reference page, written from the variables' declarations.

`python -m choir.cli.reference` (in a checkout; `make docs` runs it) rewrites both; `--check` says whether they
are up to date. tests/test_settings_documented.py fails when the files in the checkout are not what this writes.
"""

import argparse
import sys
import textwrap
from pathlib import Path

from choir.cli import flags
from choir.core.variables import GROUPS, VLLM_DEFAULTS, Variable

ENV_EXAMPLE = Path(".env.example")
SETTINGS_PAGE = Path("docs/reference/settings.md")
GENERATED = "python -m choir.cli.reference"


def flag_of(variable: str) -> str | None:
    """The `choir serve` option that sets the variable (the first, where vLLM has two spellings)."""
    own = {name: flag for flag, name in flags.CHOIR_FLAGS}
    if variable in own:
        return own[variable]
    dest = next((dest for dest, (name, _) in flags.SETTINGS.items() if name == variable and dest != "model_tag"),
                None)
    return None if dest is None else "--" + dest.replace("_", "-")


def env_example() -> str:
    lines = [f"# Choir's settings and their defaults (written by `{GENERATED}` from choir/core/variables.py).",
             "# Copy to .env and uncomment what you change; the real environment wins over .env, and a flag of",
             "# `choir serve` wins over both. The settings reference (docs/reference/settings.md) says more.",
             "",
             "# `litestar run` (Litestar reads .env too) finds the app here; `choir serve` needs no such line.",
             "LITESTAR_APP=choir.app:create_app"]
    for title, variables in [(group.title, group.variables) for group in GROUPS] + [
            ("vLLM's own variables, with Choir's defaults (set where the environment has none)", VLLM_DEFAULTS)]:
        lines += ["", f"# --- {title} ---"]
        for variable in variables:
            comment = _plain(_sentence(variable.summary) + _shown(variable.shown))
            lines += [*textwrap.wrap(comment, 110, initial_indent="# ", subsequent_indent="# ",
                                     break_on_hyphens=False), f"#{variable.name}={variable.default}"]
    return "\n".join(lines) + "\n"


def settings_page() -> str:
    lines = ["# Settings reference", "",
             f"<!-- Written by `{GENERATED}` from `choir/core/variables.py`: edit the declarations, "
             "not this page. -->",
             "",
             "Every setting is an environment variable, or a line in a `.env` file in the directory Choir starts in",
             "(`.env.example` lists them all, commented out, at their defaults). Most are also an option of",
             "`choir serve`, and an option wins over the environment; every `vllm serve` option is accepted too",
             "(see [the command line](cli.md)). A bad value stops start-up with one line naming the setting.",
             ""]
    for group in GROUPS:
        lines += [f"## {group.title}", "", "| Variable | `choir serve` option | Default | Meaning |",
                  "|---|---|---|---|"]
        lines += [_row(variable) for variable in group.variables]
        lines.append("")
    lines += ["## vLLM's own variables", "",
              "The engine reads every `VLLM_*` variable as vLLM does; Choir sets these two when the environment "
              "has neither.", "", "| Variable | Default | Meaning |", "|---|---|---|"]
    lines += [f"| `{v.name}` | `{v.default}` | {_sentence(v.summary)} |" for v in VLLM_DEFAULTS]
    return "\n".join(lines) + "\n"


def _row(variable: Variable) -> str:
    flag = flag_of(variable.name)
    if flag and variable.boolean:
        flag = f"{flag}, --no-{flag.removeprefix('--')}"
    default = variable.shown or (f"`{variable.default}`" if variable.default else "*(unset)*")
    meaning = _sentence(variable.summary) + (f" {variable.detail}" if variable.detail else "")
    return f"| `{variable.name}` | {f'`{flag}`' if flag else ''} | {default} | {meaning} |"


def _sentence(summary: str) -> str:
    return summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")


def _shown(default: str) -> str:
    if not default:
        return ""
    return f" {_sentence(default)}" if default.startswith("unset") else f" Default: {default}."


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=GENERATED, description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether the files are up to date")
    args = parser.parse_args(argv)
    stale = [path for path, text in ((ENV_EXAMPLE, env_example()), (SETTINGS_PAGE, settings_page()))
             if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} is not what {GENERATED} writes: run it", file=sys.stderr)
        return 1 if stale else 0
    for path, text in ((ENV_EXAMPLE, env_example()), (SETTINGS_PAGE, settings_page())):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
