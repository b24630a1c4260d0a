"""Every runnable lab, keyed by its catalogue id, in catalogue order.

Metadata only: importing this never imports torch (the web app lists labs and renders stored runs).
"""

from __future__ import annotations

from sharding_lab.catalog import CATALOG
from sharding_lab.labs.base import Lab
from sharding_lab.labs.beyond_comm_labs import COMM_BEYOND_LABS
from sharding_lab.labs.beyond_memory_labs import MEMORY_BEYOND_LABS
from sharding_lab.labs.beyond_partition_labs import PARTITION_LABS
from sharding_lab.labs.comm_labs import COMM_LABS
from sharding_lab.labs.gathering_labs import GATHERING_LABS
from sharding_lab.labs.model_state_labs import MODEL_STATE_LABS

_BY_ID = {
    lab.id: lab
    for lab in (*MODEL_STATE_LABS, *GATHERING_LABS, *COMM_LABS, *MEMORY_BEYOND_LABS, *COMM_BEYOND_LABS, *PARTITION_LABS)
}
LABS: dict[str, Lab] = {info.id: _BY_ID[info.id] for info in CATALOG if info.id in _BY_ID}


def get_lab(lab_id: str) -> Lab:
    """The lab with this id; KeyError listing the known ids otherwise."""
    try:
        return LABS[lab_id]
    except KeyError:
        raise KeyError(f"unknown lab {lab_id!r}; known labs: {', '.join(LABS)}") from None
