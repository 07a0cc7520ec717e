"""gymnasium's ``DictInfoToList`` with a fast path for flat infos.

RLlib wraps every vector env in ``DictInfoToList`` (per-env info dicts for the episodes).
Its conversion walks every key and every env in Python with generic nesting and mask
handling: ~0.37 ms per step of 32 cluster envs (12 info keys). For flat infos (every
value an array) the same dicts come from one ``zip`` over the columns' elements (the
same numpy scalars, the same key order); nested infos and masks that are not all true
(a sub-env reset on this step) take gymnasium's own conversion.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.wrappers.vector import DictInfoToList


class FastDictInfoToList(DictInfoToList):
    """``DictInfoToList`` whose flat, fully-masked case is one ``zip`` (same lists)."""

    def _convert_info_to_list(self, vector_infos: dict) -> list[dict[str, Any]]:
        keys = [key for key in vector_infos if not key.startswith("_")]
        columns, full_masks = [], set()  # envs often share one mask array for every key
        for key in keys:
            value, mask = vector_infos[key], vector_infos.get(f"_{key}")
            if not isinstance(value, np.ndarray) or len(value) != self.num_envs:
                return super()._convert_info_to_list(vector_infos)
            if mask is not None and id(mask) not in full_masks:
                if not mask.all():
                    return super()._convert_info_to_list(vector_infos)
                full_masks.add(id(mask))
            columns.append(list(value))
        if not keys:
            return [{} for _ in range(self.num_envs)]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
