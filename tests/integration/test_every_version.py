"""Every API the node advertises answers at every version it advertises, on a real node.

Clients pick one version per API and today's clients pick the newest, so a version nobody's
client sends can break unseen (Fetch v4–v8 once killed the request and closed the connection).
Each request is built through the codec from one set of values written for all versions of its
API (`tests.support.requests`), naming the sweep's topic by its real id where the version
names topics by id. An answer is well formed when it decodes at that version with the
request's correlation id, no error in it anywhere is UNKNOWN_SERVER_ERROR or UNKNOWN_TOPIC_ID
(the id was the topic's own), and the node logged no handler failure while answering.

Requests are sent by hand (`tests.support.wire`): no client library can be told to send, say,
ListOffsets v2.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from broker.protocol import SUPPORTED, ApiKey, ErrorCode, request_type
from broker.protocol.versions import REFUSED, is_decodable
from tests.integration.clients import create_topic
from tests.support.nodes import RunningNode, run_node
from tests.support.requests import TEMPLATES, TOPIC, error_codes, fill
from tests.support.wire import call


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with run_node(tmp_path_factory.mktemp("every-version")) as running:
        create_topic(running.bootstrap, TOPIC, 1)
        for version in SUPPORTED[ApiKey.DELETE_TOPICS]:
            create_topic(running.bootstrap, f"doomed-v{version}", 1)
        yield running


@pytest.fixture(scope="module")
def topic_id(node: RunningNode) -> uuid.UUID:
    """The id the node gave the sweep's topic (Metadata v12 tells it)."""
    values = {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False}
    response = call(
        ("localhost", node.port),
        ApiKey.METADATA,
        12,
        fill(request_type(ApiKey.METADATA, 12), values),
    )
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.none
    assert topic.topic_id is not None
    return uuid.UUID(str(topic.topic_id))


def _advertised(node: RunningNode) -> dict[int, tuple[int, int]]:
    response = call(
        ("localhost", node.port),
        ApiKey.API_VERSIONS,
        3,
        fill(
            request_type(ApiKey.API_VERSIONS, 3),
            TEMPLATES[ApiKey.API_VERSIONS](3, uuid.UUID(int=0)),
        ),
    )
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def test_every_advertised_api_has_a_request_here(node: RunningNode) -> None:
    advertised = _advertised(node)
    assert set(advertised) == set(TEMPLATES), "an advertised API this sweep cannot send"
    for api_key, (low, high) in advertised.items():
        assert (low, high) == (SUPPORTED[ApiKey(api_key)].min, SUPPORTED[ApiKey(api_key)].max)


@pytest.mark.parametrize("api_key", sorted(TEMPLATES), ids=lambda key: ApiKey(key).name)
def test_every_version_is_answered(node: RunningNode, topic_id: uuid.UUID, api_key: ApiKey) -> None:
    template = TEMPLATES[api_key]
    logged = len(node.log.read_text(errors="replace"))
    answered = []
    for version in SUPPORTED[api_key]:
        if not is_decodable(api_key, version):
            # Advertised so that old clients' exact-version checks pass, refused by closing.
            assert version in REFUSED[api_key]
            continue
        body = fill(request_type(api_key, version), template(version, topic_id))
        try:
            response = call(("localhost", node.port), api_key, version, body)
        except (ConnectionError, OSError) as exc:
            pytest.fail(f"{api_key.name} v{version}: {exc}\n{node.log_tail()}")
        failed = [
            (where, ErrorCode(code).name)
            for where, code in error_codes(response)
            if code in (ErrorCode.unknown_server_error, ErrorCode.unknown_topic_id)
        ]
        assert not failed, f"{api_key.name} v{version}: {failed}"
        answered.append(version)
    assert answered
    since = node.log.read_text(errors="replace")[logged:]
    assert "handler failed" not in since, since[-6000:]
