from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_JOIN: _ClassVar[Stage]
    STAGE_TRAIN: _ClassVar[Stage]
    STAGE_EVALUATE: _ClassVar[Stage]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_UNSPECIFIED: _ClassVar[Action]
    ACTION_RUN: _ClassVar[Action]
    ACTION_ABORTED: _ClassVar[Action]
    ACTION_FINISHED: _ClassVar[Action]

class CollaboratorStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLABORATOR_STATUS_UNSPECIFIED: _ClassVar[CollaboratorStatus]
    COLLABORATOR_STATUS_BUDGET_SPENT: _ClassVar[CollaboratorStatus]
    COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT: _ClassVar[CollaboratorStatus]
STAGE_UNSPECIFIED: Stage
STAGE_JOIN: Stage
STAGE_TRAIN: Stage
STAGE_EVALUATE: Stage
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
ACTION_UNSPECIFIED: Action
ACTION_RUN: Action
ACTION_ABORTED: Action
ACTION_FINISHED: Action
COLLABORATOR_STATUS_UNSPECIFIED: CollaboratorStatus
COLLABORATOR_STATUS_BUDGET_SPENT: CollaboratorStatus
COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT: CollaboratorStatus

class Binding(_message.Message):
    __slots__ = ("federation_id", "round", "stage", "step")
    FEDERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    federation_id: str
    round: int
    stage: Stage
    step: int
    def __init__(self, federation_id: _Optional[str] = ..., round: _Optional[int] = ..., stage: _Optional[_Union[Stage, str]] = ..., step: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("index", "count", "total_size", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    count: int
    total_size: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., count: _Optional[int] = ..., total_size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("binding", "wire_version")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    wire_version: int
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., wire_version: _Optional[int] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("binding", "settings", "plan_digest", "wire_version")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    settings: bytes
    plan_digest: str
    wire_version: int
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., settings: _Optional[bytes] = ..., plan_digest: _Optional[str] = ..., wire_version: _Optional[int] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("after",)
    AFTER_FIELD_NUMBER: _ClassVar[int]
    after: Binding
    def __init__(self, after: _Optional[_Union[Binding, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("binding", "action", "input_size", "deadline_seconds", "plan_digest", "input", "manifest_digest")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    action: Action
    input_size: int
    deadline_seconds: float
    plan_digest: str
    input: bytes
    manifest_digest: str
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., action: _Optional[_Union[Action, str]] = ..., input_size: _Optional[int] = ..., deadline_seconds: _Optional[float] = ..., plan_digest: _Optional[str] = ..., input: _Optional[bytes] = ..., manifest_digest: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("binding",)
    BINDING_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ...) -> None: ...

class ModelPart(_message.Message):
    __slots__ = ("binding", "dtype", "threshold", "theta")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    dtype: DType
    threshold: float
    theta: Chunk
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., dtype: _Optional[_Union[DType, str]] = ..., threshold: _Optional[float] = ..., theta: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ("binding", "chunk")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    chunk: Chunk
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("binding", "received_size", "sha256")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    received_size: int
    sha256: bytes
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., received_size: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class StatusReport(_message.Message):
    __slots__ = ("binding", "status", "epsilon")
    BINDING_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    binding: Binding
    status: CollaboratorStatus
    epsilon: float
    def __init__(self, binding: _Optional[_Union[Binding, _Mapping]] = ..., status: _Optional[_Union[CollaboratorStatus, str]] = ..., epsilon: _Optional[float] = ...) -> None: ...
