"""The flags of `table.TABLE` for a reader: `help_text`, the command's
`--help` (computed from the declarations, without Keras: `cli` prints
it), and `markdown`, the flag table of docs/training.md (a test compares
the two), which

    python -m keras_largebatch.train.config.help

prints.
"""

from keras_largebatch.train.config.table import GROUPS
from keras_largebatch.train.config.table import TABLE


def _first_sentence(text, width=110):
    """`text` up to its first full stop outside parentheses (not an
    abbreviation's), at most `width` characters (cut at a word, '...')."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if (char == "." and depth == 0 and text[i + 1:i + 2] in ("", " ")
                and not text[max(0, i - 3):i + 1].endswith(("e.g.", "i.e."))):
            text = text[:i + 1]
            break
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return text


def help_text(prog):
    """`--help`: the command's flags by `GROUPS`, each with its default and
    the first sentence of its help; absl's full list is `--helpfull`."""
    lines = [f"USAGE: {prog} [flags]", "",
             "The recipe's flags, grouped as the run's config; every flag "
             "with its whole help and absl's own flags: --helpfull.", ""]
    for group, doc in GROUPS.items():
        lines.append(f"{group}: {doc.split(' (`')[0].rstrip('.')}")
        for flag in TABLE:
            if flag.group != group:
                continue
            default = "none" if flag.default in (None, "") else flag.default
            if flag.kind == "enum":
                default = f"{default}; one of {', '.join(flag.values)}"
            lines.append(f"  --{flag.name} (default: {default}): "
                         f"{_first_sentence(flag.help)}")
        lines.append("")
    return "\n".join(lines).rstrip()


def markdown():
    """The flag table of docs/training.md."""
    rows = ["| flag | default | resume may change it | |",
            "|---|---|---|---|"]
    for flag in TABLE:
        default = "(none)" if flag.default is None else flag.default
        change = ("yes" if flag.free else "raise only" if flag.raise_only
                  else "no")
        rows.append(f"| `--{flag.name}` | `{default}` | {change} | "
                    f"{flag.help} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
