"""What client and server must agree on (Kudu's ``common/``).

Column types, table schemas, primary-key encoding, hash partitioning and the encoding of row
operations to and from their ``proto`` messages. Shared by ``tserver`` and ``client``; imports
only ``proto``.
"""

from raftlet.schema.keys import KeyDecodeError, KeyEncodeError, decode_key, encode_key
from raftlet.schema.partition import partition_for_encoded_key, partition_for_key
from raftlet.schema.predicates import Predicate, PredicateError, PredicateKind
from raftlet.schema.rows import (
    ErrorCode,
    OpType,
    RowFailure,
    RowOp,
    RowOpError,
    decode_row_op,
    decode_row_ops,
    encode_row_op,
    row_from_pb,
    row_to_pb,
)
from raftlet.schema.schema import ColumnSchema, Schema, SchemaError
from raftlet.schema.types import (
    DataType,
    TypeMismatch,
    Value,
    datetime_from_micros,
    micros_from_datetime,
    normalize,
    value_from_pb,
    value_to_pb,
)

__all__ = [
    "ColumnSchema",
    "DataType",
    "ErrorCode",
    "KeyDecodeError",
    "KeyEncodeError",
    "OpType",
    "Predicate",
    "PredicateError",
    "PredicateKind",
    "RowFailure",
    "RowOp",
    "RowOpError",
    "Schema",
    "SchemaError",
    "TypeMismatch",
    "Value",
    "datetime_from_micros",
    "decode_key",
    "decode_row_op",
    "decode_row_ops",
    "encode_key",
    "encode_row_op",
    "micros_from_datetime",
    "normalize",
    "partition_for_encoded_key",
    "partition_for_key",
    "row_from_pb",
    "row_to_pb",
    "value_from_pb",
    "value_to_pb",
]

# Last, so the re-exports above stay at the top; see raftlet/__init__.py.
from raftlet import require_namespaced

require_namespaced(__name__)
