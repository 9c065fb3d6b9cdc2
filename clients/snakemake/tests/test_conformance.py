"""Snakemake's own test base for executor plugins (`snakemake.common.tests`), run against this
plugin in both its modes: a plain shell rule's command as the task, and every job spawned as
`python -m snakemake` (as other remote executors run them)."""

import os
from typing import Optional

import snakemake.common.tests
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from snakemake_executor_plugin_htc import ExecutorSettings

HTC = os.environ.get("HTC", "htc")


class TestWorkflowsDirect(snakemake.common.tests.TestWorkflowsLocalStorageBase):  # type: ignore[misc]
    __test__ = True

    def get_executor(self) -> str:
        return "htc"

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings(binary=HTC)


class TestWorkflowsSpawned(TestWorkflowsDirect):
    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings(binary=HTC, spawn_snakemake=True)
