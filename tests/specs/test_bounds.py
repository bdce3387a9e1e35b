"""Every number a spec holds has an upper bound (and floats are finite): the size caps that keep absurd
input from hanging the planner. A new numeric field without `le=`/`lt=` fails here with its name."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Union, get_args, get_origin

import pytest

from autoshard.specs.base import FrozenSpec, _is_number_annotation
from autoshard.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, NodeSpec, PoolSpec
from autoshard.specs.job import ServeJob, TrainJob
from autoshard.specs.model import (
    Checkpoint, LayerGroup, MLAConfig, ModelSpec, MoEConfig, ServingDefaults, TrainingDefaults,
)

SPECS = [ModelSpec, LayerGroup, MLAConfig, MoEConfig, TrainingDefaults, ServingDefaults, Checkpoint, ClusterSpec,
         PoolSpec, NodeSpec, GpuSpec, EfficiencySpec, TrainJob, ServeJob]


def _upper_bound(metadata) -> float | None:
    for m in metadata:
        for attr in ("le", "lt"):  # annotated_types.Le / Lt, as pydantic's Field(le=/lt=) stores them
            if type(m).__name__ == attr.capitalize() and getattr(m, attr, None) is not None:
                return getattr(m, attr)
        inner = _upper_bound(getattr(m, "metadata", ()))  # a FieldInfo inside Annotated[...]
        if inner is not None:
            return inner
    return None


def _bounds(annotation) -> list:
    """Metadata of every Annotated member of a field type (Optional[Annotated[int, ...]] included)."""
    origin = get_origin(annotation)
    if origin is Union or origin is UnionType:
        return [b for a in get_args(annotation) for b in _bounds(a)]
    if origin is Annotated:
        return list(annotation.__metadata__)
    return []


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.__name__)
def test_every_numeric_field_has_an_upper_bound(spec: type[FrozenSpec]) -> None:
    unbounded = []
    for name, field in spec.model_fields.items():
        if not _is_number_annotation(field.annotation):
            continue
        if _upper_bound([*field.metadata, *_bounds(field.annotation)]) is None:
            unbounded.append(name)
    assert unbounded == [], f"{spec.__name__}: give {unbounded} an upper bound (le=, see autoshard/specs/base.py)"


def test_specs_refuse_nan_and_infinity() -> None:
    for spec in SPECS:
        assert spec.model_config.get("allow_inf_nan") is False, spec.__name__
