"""A fake Kafka broker that only records: real clients talk to it, it keeps every request frame.

`RecordingBroker` listens on 127.0.0.1 at an ephemeral port and serves every connection from
one background thread. It stores each request frame exactly as received (without its size
prefix) and answers just enough, through `broker.protocol`, for a client to reach its next
step: it is one broker (node 1) that leads partition 0 of any topic anyone asks about, accepts
every produce at offset 0, coordinates every group itself and turns every JoinGroup away.
Records are not kept as data and no fetch ever returns any: it is not the broker under test.
A frame it cannot decode is still recorded; then it closes that connection, as Kafka would,
and notes the error in `errors`.

Responses are described as plain dicts and shaped to the version the client asked for by
`fit`: fields that version lacks are dropped, fields it requires and the dict leaves out get
their zero value (0, "", False, (), no error). So an API without a case of its own still gets
a well-formed empty answer at any version.
"""

from __future__ import annotations

import dataclasses
import datetime
import selectors
import socket
import threading
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    ErrorCode,
    FrameReader,
    UnsupportedVersion,
    decode_request,
    encode_response,
    response_type,
    unsupported_version_answer,
)

__all__ = ["NODE_ID", "RecordingBroker", "api_key_of", "fit"]

NODE_ID = 1
"""The recorder's broker id: the leader of every partition and the coordinator of every group."""

_SELECT_INTERVAL = 0.05
_STOP_TIMEOUT = 5.0
_ZEROS: dict[str, Any] = {
    "bool": False,
    "string": "",
    "bytes": b"",
    "records": b"",
    "float64": 0.0,
    "uuid": uuid.UUID(int=0),
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
}


def api_key_of(frame: bytes) -> int:
    """The API key that opens a request frame (its first int16)."""
    return int.from_bytes(frame[:2], "big", signed=True)


class RecordingBroker:
    """Records every request frame it receives; see the module docstring for what it answers.

    Use as a context manager, or call `start` and `close`. `close` stops the serving thread and
    closes every socket; it is safe to call twice.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, data=None)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recording-broker", daemon=True)
        self._lock = threading.Lock()
        self._frames: list[bytes] = []
        self._errors: list[str] = []
        self._topics: dict[str, None] = {}  # every topic asked about, in order: a set that keeps it

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def frames(self) -> list[bytes]:
        """Every request frame received so far, in arrival order, without size prefixes."""
        with self._lock:
            return list(self._frames)

    @property
    def errors(self) -> list[str]:
        """What went wrong serving a request: undecodable frames, or a bug in this fake."""
        with self._lock:
            return list(self._errors)

    def received(self, api_key: int) -> bool:
        """Whether a request with `api_key` has arrived."""
        return any(api_key_of(frame) == api_key for frame in self.frames)

    def start(self) -> RecordingBroker:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread.ident is None:  # never started, so its cleanup never runs
            self._close_sockets()
            return
        self._thread.join(_STOP_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("the recording broker's thread did not stop")

    def __enter__(self) -> RecordingBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # The serving thread.

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, _events in self._selector.select(_SELECT_INTERVAL):
                    if key.data is None:
                        self._accept()
                    else:
                        self._receive(typing.cast(socket.socket, key.fileobj), key.data)
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for key in list(self._selector.get_map().values()):
            typing.cast(socket.socket, key.fileobj).close()
        self._selector.close()

    def _accept(self) -> None:
        try:
            conn, _address = self._listener.accept()
        except BlockingIOError:
            return
        # Blocking with a timeout: recv only runs once select says data is there, and answers
        # are a few hundred bytes, so sendall never waits on a live client.
        conn.settimeout(_STOP_TIMEOUT)
        self._selector.register(conn, selectors.EVENT_READ, data=FrameReader())

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        conn.close()

    def _receive(self, conn: socket.socket, reader: FrameReader) -> None:
        try:
            data = conn.recv(65536)
            if not data:
                self._drop(conn)
                return
            reader.receive_data(data)
            while (cut := reader.next_frame()) is not None:
                frame = bytes(cut)  # a reader that never gathers cuts bytes already
                with self._lock:
                    self._frames.append(frame)
                answer = self._answer(frame)
                if answer is None:
                    self._drop(conn)
                    return
                conn.sendall(answer)
        except OSError:  # the client went away
            self._drop(conn)
        except Exception as exc:  # an undecodable frame or a bug here: close, as Kafka would
            with self._lock:
                self._errors.append(f"{type(exc).__name__}: {exc}")
            self._drop(conn)

    # What to answer.

    def _answer(self, frame: bytes) -> bytes | None:
        """The response frame; b"" for no response; None to close the connection."""
        try:
            request = decode_request(frame)
        except UnsupportedVersion as exc:
            return unsupported_version_answer(exc)
        header, body = request.header, request.body
        if header.api_key == ApiKey.PRODUCE and getattr(body, "acks", None) == 0:
            return b""
        answer = self._ANSWERS.get(header.api_key, RecordingBroker._empty)
        values = answer(self, body)
        return encode_response(
            header, fit(response_type(header.api_key, header.api_version), values)
        )

    def _me(self) -> dict[str, Any]:
        return {"node_id": NODE_ID, "host": self.host, "port": self.port}

    def _api_versions(self, body: Any) -> dict[str, Any]:
        return {
            "api_keys": [
                {"api_key": key, "min_version": versions.min, "max_version": versions.max}
                for key, versions in SUPPORTED.items()
            ]
        }

    def _metadata(self, body: Any) -> dict[str, Any]:
        asked = [topic.name for topic in body.topics or () if topic.name]
        self._topics.update(dict.fromkeys(asked))
        return {
            "brokers": [self._me()],
            "cluster_id": "recording-broker",
            "controller_id": NODE_ID,
            "topics": [_topic_metadata(name) for name in asked or self._topics],
        }

    def _produce(self, body: Any) -> dict[str, Any]:
        return {
            "responses": [
                {
                    "name": topic.name,
                    "partition_responses": [
                        {"index": partition.index, "base_offset": 0, "log_start_offset": 0}
                        for partition in topic.partition_data
                    ],
                }
                for topic in body.topic_data
            ]
        }

    def _init_producer_id(self, body: Any) -> dict[str, Any]:
        return {"producer_id": 1000, "producer_epoch": 0}

    def _find_coordinator(self, body: Any) -> dict[str, Any]:
        keys = getattr(body, "coordinator_keys", ())  # v4+ asks for several keys at once
        return {**self._me(), "coordinators": [{"key": key, **self._me()} for key in keys]}

    def _join_group(self, body: Any) -> dict[str, Any]:
        # Recording the JoinGroup is the point. An error that clients do not retry at once
        # stops the group there: no SyncGroup, offsets or fetches follow.
        return {"error_code": ErrorCode.group_authorization_failed}

    def _empty(self, body: Any) -> dict[str, Any]:
        """Any other API: a well-formed answer with no error and nothing in it."""
        return {}

    _ANSWERS: typing.ClassVar[dict[int, Callable[[RecordingBroker, Any], dict[str, Any]]]] = {
        ApiKey.API_VERSIONS: _api_versions,
        ApiKey.METADATA: _metadata,
        ApiKey.PRODUCE: _produce,
        ApiKey.INIT_PRODUCER_ID: _init_producer_id,
        ApiKey.FIND_COORDINATOR: _find_coordinator,
        ApiKey.JOIN_GROUP: _join_group,
    }


def _topic_metadata(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": uuid.uuid5(uuid.NAMESPACE_URL, f"recording-broker/{name}"),
        "partitions": [
            {
                "partition_index": 0,
                "leader_id": NODE_ID,
                "leader_epoch": 0,
                "replica_nodes": [NODE_ID],
                "isr_nodes": [NODE_ID],
            }
        ],
    }


def fit(entity: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of the kio class `entity` (a message or one of its structs) from `values`.

    Keys that `entity` has no field for are dropped, so one dict can answer every version;
    required fields missing from `values` get their zero value.
    """
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(entity):
        tp, nullable = _unwrap_optional(field.type)
        if field.name in values:
            kwargs[field.name] = _shape(tp, values[field.name])
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            kwargs[field.name] = None if nullable else _zero(tp, field.metadata.get("kafka_type"))
    return entity(**kwargs)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        (inner,) = (arg for arg in typing.get_args(tp) if arg is not type(None))
        return inner, True
    return tp, False


def _shape(tp: Any, value: Any) -> Any:
    if typing.get_origin(tp) is tuple:
        element, _nullable = _unwrap_optional(typing.get_args(tp)[0])
        return tuple(_shape(element, item) for item in value)
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return fit(typing.cast(type, tp), value)
    return value


def _zero(tp: Any, kafka_type: str | None) -> Any:
    if typing.get_origin(tp) is tuple:
        return ()
    if dataclasses.is_dataclass(tp):
        return fit(typing.cast(type, tp), {})
    if kafka_type is None:
        raise TypeError(f"no zero value for {tp!r}")
    return _ZEROS.get(kafka_type, 0)  # the rest are integer types
