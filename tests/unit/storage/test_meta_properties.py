"""A log dir's identity (`meta.properties`): formatting as `kafka-storage format` does, a
directory id of each dir's own (KIP-858), a start that never formats the metadata log dir
itself, and the refusals that keep a node from serving another cluster's, another node's or a
copied dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.storage import StorageError
from broker.storage.meta_properties import (
    META_PROPERTIES,
    NotFormatted,
    format_dirs,
    load_formatted,
    load_or_format,
    new_directory_id,
    read_meta_properties,
)
from broker.storage.partition_metadata import encode_uuid


def test_format_writes_kafkas_fields_and_a_directory_id_per_dir(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    assert format_dirs(dirs, "cluster-1", 3) == dirs
    first, second = (read_meta_properties(d) for d in dirs)
    assert first is not None
    assert second is not None
    assert (first.cluster_id, first.node_id) == ("cluster-1", 3)
    assert first.directory_id is not None
    assert first.directory_id != second.directory_id
    text = (dirs[0] / META_PROPERTIES).read_text()
    assert f"directory.id={encode_uuid(first.directory_id)}\n" in text
    assert "version=1\n" in text


def test_a_formatted_dir_is_refused_unless_asked_to_leave_it(tmp_path: Path) -> None:
    format_dirs([tmp_path], "cluster-1", 1)
    before = (tmp_path / META_PROPERTIES).read_text()
    with pytest.raises(StorageError, match=r"formatted already.*--ignore-formatted"):
        format_dirs([tmp_path], "cluster-1", 1)
    assert format_dirs([tmp_path], "cluster-1", 1, ignore_formatted=True) == []
    assert (tmp_path / META_PROPERTIES).read_text() == before, "its directory id is kept"
    with pytest.raises(StorageError, match="belongs to cluster cluster-1, not cluster-2"):
        format_dirs([tmp_path], "cluster-2", 1, ignore_formatted=True)


def test_a_dir_with_data_and_no_identity_is_never_formatted(tmp_path: Path) -> None:
    (tmp_path / "orders-0").mkdir()
    with pytest.raises(StorageError, match=r"not empty and has no meta\.properties"):
        format_dirs([tmp_path], "cluster-1", 1)


def test_a_replaced_disk_formatted_again_is_a_new_directory(tmp_path: Path) -> None:
    """The point of directory ids: the same path, the same cluster and node, another disk."""
    old = load_or_format([tmp_path], 1, "cluster-1", new_cluster_id="unused").directory_ids
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    new = load_or_format([tmp_path], 1, "cluster-1", new_cluster_id="unused").directory_ids
    assert old[tmp_path] != new[tmp_path]


def test_a_start_refuses_an_unformatted_metadata_log_dir_and_formats_nothing(
    tmp_path: Path,
) -> None:
    """Kafka's REQUIRE_METADATA_LOG_DIR: an empty metadata log dir is a new node's or a lost
    one's, and only whoever runs the node knows which."""
    logs = [tmp_path / "a", tmp_path / "b"]
    for missing_or_empty in (False, True):
        if missing_or_empty:
            logs[0].mkdir()
        with pytest.raises(
            NotFormatted, match=r"a is not formatted \(it has no meta\.properties"
        ) as caught:
            load_formatted(logs[0], logs, 1, "c")
        assert caught.value.log_dir == logs[0]
        assert not any(read_meta_properties(d) for d in logs if d.exists())
    separate = tmp_path / "metadata"
    format_dirs(logs, "c", 1)
    with pytest.raises(NotFormatted):
        load_formatted(separate, logs, 1, "c")


def test_a_start_formats_an_empty_log_dir_beside_a_formatted_metadata_log_dir(
    tmp_path: Path,
) -> None:
    """A replaced JBOD disk comes back as a new directory of the node's cluster."""
    metadata, data = tmp_path / "metadata", tmp_path / "data"
    format_dirs([metadata, data], "c", 4)
    before = load_formatted(metadata, [data], 4)
    assert before.formatted == ()
    assert list(before.directory_ids) == [data], "the ids of the log dirs, which it registers"
    shutil.rmtree(data)
    after = load_formatted(metadata, [data], 4)
    assert after.formatted == (data,)
    found = read_meta_properties(data)
    assert found is not None
    assert (found.cluster_id, found.node_id) == ("c", 4)
    assert after.directory_ids[data] not in (before.directory_ids[data], None)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "orders-0").mkdir()
    with pytest.raises(StorageError, match=r"other is not empty and has no meta\.properties"):
        load_formatted(metadata, [data, tmp_path / "other"], 4)


def test_a_start_refuses_dirs_of_another_cluster_or_node(tmp_path: Path) -> None:
    metadata, data = tmp_path / "metadata", tmp_path / "data"
    format_dirs([metadata], "c", 1)
    format_dirs([data], "elsewhere", 1)
    with pytest.raises(StorageError, match="data belongs to cluster elsewhere, not c"):
        load_formatted(metadata, [metadata, data], 1)
    with pytest.raises(StorageError, match="metadata belongs to cluster c, not asked"):
        load_formatted(metadata, [metadata], 1, "asked")
    with pytest.raises(StorageError, match=r"belongs to node 1, not node\.id=2"):
        load_formatted(metadata, [metadata], 2)


def test_a_start_keeps_the_identity_and_refuses_strangers(tmp_path: Path) -> None:
    first = load_or_format([tmp_path], 1, None, new_cluster_id="made-here")
    assert first.cluster_id == "made-here"
    again = load_or_format([tmp_path], 1, None, new_cluster_id="another")
    assert again == first
    with pytest.raises(StorageError, match=r"belongs to node 1, not node\.id=2"):
        load_or_format([tmp_path], 2, None, new_cluster_id="x")
    with pytest.raises(StorageError, match="belongs to cluster made-here, not elsewhere"):
        load_or_format([tmp_path], 1, "elsewhere", new_cluster_id="x")


def test_a_dir_from_before_directory_ids_is_given_one(tmp_path: Path) -> None:
    (tmp_path / META_PROPERTIES).write_text("version=1\ncluster.id=c\nnode.id=1\n")
    identity = load_or_format([tmp_path], 1, "c", new_cluster_id="x")
    found = read_meta_properties(tmp_path)
    assert found is not None
    assert found.directory_id == identity.directory_ids[tmp_path]
    assert load_or_format([tmp_path], 1, "c", new_cluster_id="x") == identity


def test_a_copied_dir_is_refused(tmp_path: Path) -> None:
    format_dirs([tmp_path / "a"], "c", 1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.raises(StorageError, match=r"same directory\.id"):
        load_or_format([tmp_path / "a", tmp_path / "b"], 1, "c", new_cluster_id="x")


def test_kafkas_layout_with_comments_and_any_order_is_read(tmp_path: Path) -> None:
    directory_id = new_directory_id()
    (tmp_path / META_PROPERTIES).write_text(
        "#\n#Thu Nov 26 10:00:00 UTC 2026\n"
        f"node.id=4\ndirectory.id={encode_uuid(directory_id)}\nversion=1\ncluster.id=k\n"
    )
    found = read_meta_properties(tmp_path)
    assert found is not None
    assert (found.cluster_id, found.node_id, found.directory_id) == ("k", 4, directory_id)


def test_reserved_directory_ids_are_never_handed_out() -> None:
    assert all(new_directory_id().int >= 100 for _ in range(1000))
