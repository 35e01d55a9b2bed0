"""The federation's wire: gRPC service over mutual TLS, bounded chunks, bound messages.

- ``fedfair_pb2`` / ``fedfair_pb2_grpc``: generated from ``proto/fedfair.proto`` (do not edit;
  regenerate with ``python -m fedfair.runtime.transport.codegen``).
- ``chunks``: payloads and float tensors in bounded chunks with declared total sizes; what
  was wrong with a refused chunk stays in the receiver's log (senders hear ``MALFORMED_MESSAGE``).
- ``stage_gate``: every message bound to (federation id, round, stage and step); replays and late
  messages refused with one generic message.
- ``security``: credentials from the certs folder, peer identity from the certificate alone.
- ``wire_version``: the schema version a peer speaks, checked at GetPlan, so another release is refused at once.
"""

from fedfair.core.errors import WireError
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.transport import fedfair_pb2_grpc as pb_grpc
from fedfair.runtime.transport.stage_gate import (
    EVALUATE,
    JOIN,
    NOT_EXPECTED,
    NOT_PERMITTED,
    TRAIN,
    StageGate,
    WireStage,
    describe_binding,
    make_binding,
    receive_upload,
)
from fedfair.runtime.transport.chunks import (
    DEFAULT_CHUNK_BYTES,
    INLINE_INPUT_BYTES,
    MALFORMED_MESSAGE,
    MAX_MESSAGE_BYTES,
    Forwarder,
    InPieces,
    Pieces,
    Reassembler,
    Uploader,
    assemble,
    decode_tensor,
    digest,
    encode_tensor,
    inline_input,
    join,
    model_parts,
    payload_parts,
    read_model,
    read_payload,
    split,
    task_with_input,
)
from fedfair.runtime.transport.security import (
    PeerAuthenticator,
    TlsFiles,
    channel_credentials,
    channel_options,
    check_tls_files,
    peer_certificate,
    secure_channel,
    server_credentials,
    server_options,
)
from fedfair.runtime.transport.wire_version import (
    WIRE_VERSION,
    describe_version,
    plan_request,
    refusal_details,
    refusing_version,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EVALUATE",
    "JOIN",
    "TRAIN",
    "WireStage",
    "INLINE_INPUT_BYTES",
    "MALFORMED_MESSAGE",
    "MAX_MESSAGE_BYTES",
    "NOT_EXPECTED",
    "Forwarder",
    "InPieces",
    "NOT_PERMITTED",
    "PeerAuthenticator",
    "Pieces",
    "Reassembler",
    "StageGate",
    "TlsFiles",
    "Uploader",
    "WIRE_VERSION",
    "WireError",
    "assemble",
    "channel_credentials",
    "channel_options",
    "check_tls_files",
    "decode_tensor",
    "describe_binding",
    "describe_version",
    "digest",
    "encode_tensor",
    "inline_input",
    "join",
    "make_binding",
    "model_parts",
    "payload_parts",
    "pb",
    "pb_grpc",
    "peer_certificate",
    "plan_request",
    "read_model",
    "read_payload",
    "receive_upload",
    "refusal_details",
    "refusing_version",
    "secure_channel",
    "server_credentials",
    "server_options",
    "split",
    "task_with_input",
]
