"""The cohort config: one YAML file describes a run and is read by every process of it.

Tokens never live in the file; they come from the environment (``CORL_ADMIN_TOKEN``).
Relative paths are resolved against the file's directory. ``load_config`` reports every wrong
field at once.
"""

from .base import Name
from .cohort import (
    CohortConfig,
    ConfigError,
    LoraConfig,
    MemberConfig,
    PromptSource,
    RoundsConfig,
    TaskConfig,
    TrainingConfig,
    dump_config,
    load_config,
    parse_config,
)
from .endpoint import EndpointConfig
from .reward import JudgeConfig, ReliabilityConfig, RewardConfig, VoteConfig
from .sandbox import SandboxConfig
from .scale import DistributedConfig, MemberVllm
from .tracking import MlflowConfig, TrackerUnavailable, TrackingConfig, WandbConfig

__all__ = [
    "CohortConfig",
    "ConfigError",
    "DistributedConfig",
    "EndpointConfig",
    "JudgeConfig",
    "LoraConfig",
    "MemberConfig",
    "MemberVllm",
    "MlflowConfig",
    "Name",
    "PromptSource",
    "ReliabilityConfig",
    "RewardConfig",
    "RoundsConfig",
    "SandboxConfig",
    "TaskConfig",
    "TrackerUnavailable",
    "TrackingConfig",
    "TrainingConfig",
    "VoteConfig",
    "WandbConfig",
    "dump_config",
    "load_config",
    "parse_config",
]
