"""What a backup holds: every table's changelog and the dead letters, never the parked ids."""

from __future__ import annotations

from app.ops.backup import backup_topics
from app.platform.faust.tables import PARKED_SUFFIX
from app.platform.internal_topics import changelog_specs
from app.platform.topics import DLQ


def test_a_backup_holds_every_changelog_but_the_parked_ids_and_the_dead_letters() -> None:
    names = {spec.name for spec in backup_topics()}
    parked = {spec.name for spec in changelog_specs() if f"{PARKED_SUFFIX}-changelog" in spec.name}
    assert len(parked) == 5  # one parking table per faust group whose stream has a retry path
    assert names == {spec.name for spec in changelog_specs()} - parked | {DLQ.name}
    assert {"avcc-code-records-changelog", "avcc-code-claims-changelog"} <= names
