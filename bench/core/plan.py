"""A plan: a study's or the GPU check's runs as data, the record they go
into, and the runs that wait on others (`then`)."""

import dataclasses
import os

from bench.core import provenance
from bench.core import records


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    record: str
    about: str
    specs: tuple
    then: object = None  # runs -> more specs, or None
    # Its runs are the report's comparisons: findings, fronts, the table of
    # every configuration (`selection.load_all`).
    compared: bool = False

    def all_specs(self, runs=()):
        """Its specs and those `then` adds given `runs`, for every machine
        kind (a spec `then` made for one kind names it: `for_kind`)."""
        return list(self.specs) + list(self.then(runs) if self.then else [])

    def specs_here(self, runs=()):
        """`all_specs` less those made for another machine kind than this
        one (`provenance.machine_kind` of this process's backend): what a
        runner here starts."""
        here = provenance.machine_kind(provenance.machine())
        return [s for s in self.all_specs(runs)
                if s.get("for_kind", here) == here]

    def path(self, results=records.RESULTS):
        """Its record's file in the folder `results`."""
        return os.path.join(results, self.record + ".json")
