"""A plan: a study's or the GPU check's runs as data, the record they go
into, and the runs that wait on others (`then`)."""

import dataclasses
import os

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
        return list(self.specs) + list(self.then(runs) if self.then else [])

    def path(self, results=records.RESULTS):
        """Its record's file in the folder `results`."""
        return os.path.join(results, self.record + ".json")
