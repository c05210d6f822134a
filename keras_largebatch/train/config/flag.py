"""One flag, declared once: `declare` in a field of a `RunConfig` group
(`run_config.py`), and `Flag`, the record of it that the parser, the
checks, the resume rules and `--help` read (`table.TABLE`).

    momentum: float = declare(0.9, "Momentum.")

The field's name is the flag's, its type the value the config holds, its
default the default run's; `declare` adds the help and the rules. The
absl kind follows from the type: `integer`, `float`, `boolean`, `enum` (a
`str` with `values`) or `string`.
"""

import dataclasses

KEY = "flag"  # The key of the field metadata that holds the rules.
KINDS = {int: "integer", float: "float", bool: "boolean", str: "string"}


def declare(default, help, *, values=(), minimum=None, valid=None,
            free=False, raise_only=False, recorded=True, grammar=None):
    """A `RunConfig` field that is a flag: its default (as the config
    holds it) and help, and the rules `Flag` describes."""
    rules = dict(help=help, values=values, minimum=minimum, valid=valid,
                 free=free, raise_only=raise_only, recorded=recorded,
                 grammar=grammar)
    return dataclasses.field(default=default, metadata={KEY: rules})


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag of the command, as its field declares it.

    Attributes:
        name, kind, default, help: as absl's `DEFINE_<kind>` takes them
            (`default` as the command line writes it).
        group: the `RunConfig` part (the `GROUPS` entry) it belongs to.
        type: the type of its field (None allowed where the default is).
        config_default: its default as its field holds it.
        values: the choices of an `enum`.
        minimum: an `integer`'s smallest value.
        valid: `(predicate, expected)` for other values (None passes).
        free: resuming a run may change it (it changes neither the model,
            the data, the schedule nor the optimizer).
        raise_only: resuming a run may raise it (see
            `checkpointing/resume.py`).
        recorded: written to `run_config.json` and checked on resume.
        grammar: for a `string` whose value is typed, the module that
            parses it once (`TYPE`, `parse(name, text)`, `show(value)`).
    """

    name: str
    kind: str
    default: object
    help: str
    group: str
    type: object
    config_default: object
    values: tuple = ()
    minimum: int = None
    valid: tuple = None
    free: bool = False
    raise_only: bool = False
    recorded: bool = True
    grammar: object = None

    @classmethod
    def of(cls, field, group):
        """The flag that `field` of the part `group` declares."""
        rules = field.metadata[KEY]
        grammar = rules["grammar"]
        held = field.default
        kind = ("enum" if rules["values"] else KINDS[
            str if grammar else _not_none(field.type)])
        return cls(field.name, kind,
                   grammar.show(held) if grammar else held,
                   group=group, type=field.type, config_default=held,
                   **rules)

    def parse(self, value):
        """`value` (absl's, or `run_config.json`'s) as `RunConfig` holds
        it: typed by its `grammar`, if any."""
        if self.grammar is None or value is None:
            return value
        return self.grammar.parse(self.name, value)

    def show(self, value):
        """`value` as the command line writes it (`run_config.json`)."""
        return value if self.grammar is None else self.grammar.show(value)


def _not_none(annotation):
    """`int` of `int | None`; `annotation` itself otherwise."""
    args = [a for a in getattr(annotation, "__args__", ())
            if a is not type(None)]
    return args[0] if args else annotation
