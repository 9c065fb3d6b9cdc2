"""The Parsl config Parsl's own test suite runs against (`pytest --pyargs parsl.tests --config
THIS_FILE`): one HTCExecutor, an open run started here."""

from parsl.config import Config

from slurm_htc.parsl import HTCExecutor


def fresh_config() -> Config:
    return Config(executors=[HTCExecutor(label="htc")], strategy="none")
