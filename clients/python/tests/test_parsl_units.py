"""The Parsl executor's pure parts: a resource specification as task options, what is refused,
the executor's `repr` (Parsl writes it into its log). No `htc` needed."""

from __future__ import annotations

import pytest
from parsl.executors.errors import InvalidResourceSpecification
from parsl.utils import RepresentationMixin

from slurm_htc.parsl import HTCExecutor, task_options


def test_a_resource_specification_becomes_task_options() -> None:
    assert task_options(None) == {} and task_options({}) == {}
    spec = {"cores": 2, "memory": 1500, "gpus": 1, "running_time_min": 1.5, "priority": 3}
    assert task_options(spec) == {"cores": 2, "mem": "1500M", "gpus": 1, "timeout": "90s", "priority": 3}
    # A fraction of a minute is never a zero timeout (which would mean none).
    assert task_options({"running_time_min": 0.001}) == {"timeout": "1s"}


def test_a_key_it_cannot_honour_is_refused_naming_it_and_the_keys_it_takes() -> None:
    with pytest.raises(InvalidResourceSpecification) as info:
        task_options({"cores": 1, "num_nodes": 2, "disk": 10})
    assert info.value.invalid_keys == {"num_nodes", "disk"}
    assert "cores, gpus, memory, priority, running_time_min" in str(info.value)
    with pytest.raises(InvalidResourceSpecification, match=r"memory='lots' is not a number"):
        task_options({"memory": "lots"})


def test_its_repr_names_every_argument_as_parsl_s_tests_check() -> None:
    RepresentationMixin._validate_repr = True
    try:
        text = repr(HTCExecutor(label="x", cores=2, slurm={"nodes": 2}))
    finally:
        RepresentationMixin._validate_repr = False
    assert text.startswith("HTCExecutor(") and "label='x'" in text and "slurm={'nodes': 2}" in text


def test_submit_before_start_is_an_error_naming_the_executor() -> None:
    with pytest.raises(RuntimeError, match="HTCExecutor x: submit before start"):
        HTCExecutor(label="x").submit(print, {})
