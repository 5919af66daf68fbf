"""The wire contract: every model that crosses a process boundary, defined once.

Services, trainers, clients and tests import these; ``corl proto export`` writes their JSON Schemas
and the OpenAPI documents of the model server and the aggregator next to this file, and a test
fails when those drift. ``CONTRACT_VERSION`` is the version of this contract (the OpenAPI
documents' ``info.version``); it changes whenever a message changes incompatibly.
"""

from .batch import BatchDiagnostics, GradedBatch, GradedSample, PromptGroup
from .conversation import Conversation, Turn
from .dashboard import DashboardView, MemberView
from .endpoints import EndpointApi, EndpointStats, VerdictSource
from .errors import ErrorDetail, ErrorResponse, ErrorType
from .gateway import HarvestedPrompt, HarvestStats
from .generate import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    PromptFormat,
    PromptResult,
    Sample,
    SamplingSettings,
    Usage,
)
from .grade import GradeItem, GradeMode, GradeRequest, GradeResponse
from .grading import (
    GraderMode,
    GraderRegistered,
    GraderRegistration,
    GradingResult,
    GradingResults,
    GradingResultsAccepted,
    GradingTask,
    GradingTasks,
    MemberRoundStats,
    PromptRecord,
    PromptsAccepted,
    PromptsPost,
    RoundStats,
    RunStats,
)
from .heldout import HeldoutAccuracy, HeldoutReadings
from .info import HealthResponse, InfoResponse, ReadyResponse
from .modes import VOTE_READING_MODES, RewardModeName
from .openai import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    ModelList,
    TextCompletion,
)
from .reward_server import (
    ChatMessage,
    OpenRLHFRewardRequest,
    OpenRLHFRewardResponse,
    RewardServerMode,
    SlimeRewardRequest,
    SlimeRewardResponse,
)
from .sandbox import ProgramLimits, ProgramStatus, RunProgramRequest, RunProgramResponse
from .weights import (
    GroupBackend,
    SharedSegment,
    TensorMeta,
    WeightBroadcastRequest,
    WeightFormat,
    WeightTransfer,
    WeightTransferRequest,
    WeightTransferResponse,
    WeightUpdateRequest,
    WeightUpdateResponse,
)

CONTRACT_VERSION = "2"

__all__ = [
    "CONTRACT_VERSION",
    "BatchDiagnostics",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ModelList",
    "TextCompletion",
    "ErrorDetail",
    "ErrorResponse",
    "ErrorType",
    "FinishReason",
    "GenerateRequest",
    "GenerateResponse",
    "GradeItem",
    "GradeMode",
    "GradeRequest",
    "GradeResponse",
    "GradedBatch",
    "GradedSample",
    "HealthResponse",
    "HeldoutAccuracy",
    "HeldoutReadings",
    "InfoResponse",
    "PromptFormat",
    "PromptGroup",
    "PromptResult",
    "ReadyResponse",
    "RewardModeName",
    "VOTE_READING_MODES",
    "Sample",
    "SamplingSettings",
    "WeightFormat",
    "ProgramLimits",
    "ProgramStatus",
    "RunProgramRequest",
    "RunProgramResponse",
    "WeightUpdateRequest",
    "WeightUpdateResponse",
    "GroupBackend",
    "TensorMeta",
    "WeightBroadcastRequest",
    "WeightTransfer",
    "WeightTransferRequest",
    "WeightTransferResponse",
    "GraderMode",
    "GraderRegistered",
    "GraderRegistration",
    "GradingResult",
    "GradingResults",
    "GradingResultsAccepted",
    "GradingTask",
    "GradingTasks",
    "MemberRoundStats",
    "PromptRecord",
    "PromptsAccepted",
    "PromptsPost",
    "RoundStats",
    "RunStats",
    "DashboardView",
    "MemberView",
    "EndpointApi",
    "EndpointStats",
    "Conversation",
    "Turn",
    "HarvestedPrompt",
    "HarvestStats",
    "VerdictSource",
    "Usage",
    "ChatMessage",
    "OpenRLHFRewardRequest",
    "OpenRLHFRewardResponse",
    "RewardServerMode",
    "SlimeRewardRequest",
    "SharedSegment",
    "SlimeRewardResponse",
]
