"""A syrupy extension that stores each cell as one binary-safe file: goldens/<template-id>/<case-id>.txt.

Snapshot names are case ids (a reference refusal is named `<case-id>.raised`), and the directory is the
template id of the test item, so `pytest --snapshot-update` writes exactly the golden layout.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from conformance.judge.goldens import goldens_dir

# Where syrupy looks for a test item that holds no goldens (its snapshot discovery visits every item).
NO_TEMPLATE_DIR = ".no-template"


@lru_cache(maxsize=4096)
def _golden_dirname(root: str, template_id: str) -> str:
    # syrupy asks several times per assertion; the gate makes one assertion per cell.
    return os.path.join(root, template_id)


def _template_id(test_location) -> str:
    params = getattr(getattr(test_location.item, "callspec", None), "params", {})
    return params.get("chatgold_template") or NO_TEMPLATE_DIR


class GoldenExtension(SingleFileSnapshotExtension):
    file_extension = "txt"
    _write_mode = WriteMode.BINARY

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return _golden_dirname(str(goldens_dir()), _template_id(test_location))

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        return cls.dirname(test_location=test_location)

    @classmethod
    def get_snapshot_name(cls, *, test_location, index=0) -> str:
        if not isinstance(index, str):
            raise ValueError("golden snapshots are named by case id: use snapshot(name=case_id)")
        return index

    def serialize(self, data, **kwargs) -> bytes:
        return bytes(data)

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection, name_order=None) -> None:
        # Atomic, so an interrupted update never leaves a partial golden.
        from conformance.files import atomic_write

        snapshot = next(iter(snapshot_collection))
        atomic_write(Path(snapshot_collection.location), bytes(snapshot.data))
