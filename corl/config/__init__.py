"""The cohort config: one YAML file describes a run and is read by every process of it.

Tokens never live in the file; they come from the environment (``CORL_ADMIN_TOKEN``).
Relative paths are resolved against the file's directory. ``load_config`` reports every wrong
field at once. One module per section; this package imports nothing from the services or the
reward functions (the reward modes it names come from ``corl.proto``).
"""

from .base import Name
from .cohort import CohortConfig
from .endpoint import EndpointConfig
from .gateway import CanaryConfig, GatewayConfig, HarvestConfig, RedactConfig
from .loader import ConfigError, dump_config, load_config, parse_config
from .members import MemberConfig
from .placement import MemberTrainer, PlacementConfig
from .reward import GuardConfig, JudgeConfig, ReliabilityConfig, RewardConfig, VoteConfig
from .rounds import PromptSource, RoundsConfig
from .sandbox import SandboxConfig
from .scale import DistributedConfig, MemberVllm
from .task import TaskConfig
from .tracking import MlflowConfig, TrackerUnavailable, TrackingConfig, WandbConfig
from .training import LoraConfig, TrainingConfig

__all__ = [
    "CanaryConfig",
    "CohortConfig",
    "ConfigError",
    "DistributedConfig",
    "EndpointConfig",
    "GatewayConfig",
    "HarvestConfig",
    "JudgeConfig",
    "LoraConfig",
    "MemberConfig",
    "MemberTrainer",
    "MemberVllm",
    "MlflowConfig",
    "Name",
    "PlacementConfig",
    "PromptSource",
    "RedactConfig",
    "ReliabilityConfig",
    "RewardConfig",
    "GuardConfig",
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
