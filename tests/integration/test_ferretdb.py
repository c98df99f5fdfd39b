"""pymongo against a real wire-protocol server (FerretDB v1), and what this server refuses that MongoDB
accepts, so the store never relies on it."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import DuplicateKeyError, OperationFailure

pytestmark = pytest.mark.integration


def test_insert_and_unique_index(mongo_db: Any) -> None:
    faults = mongo_db.faults
    faults.create_index("dedup_key", unique=True)
    faults.insert_one({"dedup_key": "n1/GPU/0000:3b:00/XID-79", "count": 1})
    with pytest.raises(DuplicateKeyError):
        faults.insert_one({"dedup_key": "n1/GPU/0000:3b:00/XID-79", "count": 2})
    assert faults.count_documents({}) == 1


def test_claim_with_find_one_and_update_on_an_indexed_field_with_a_sort(mongo_db: Any) -> None:
    work = mongo_db.work
    work.create_index([("status", pymongo.ASCENDING), ("seq", pymongo.ASCENDING)])
    work.insert_many([{"_id": f"f{i}", "status": "pending", "seq": i} for i in (3, 1, 2)])
    claimed = work.find_one_and_update(
        {"status": "pending"},
        {"$set": {"status": "claimed", "owner": "w1"}, "$inc": {"attempts": 1}},
        sort=[("seq", pymongo.ASCENDING)],
        return_document=pymongo.ReturnDocument.AFTER,
    )
    assert (claimed["_id"], claimed["status"], claimed["attempts"]) == ("f1", "claimed", 1)
    fenced = work.update_one({"_id": "f1", "owner": "w2"}, {"$set": {"status": "done"}})
    assert fenced.modified_count == 0  # another owner cannot complete it
    assert work.count_documents({"status": "pending"}) == 2


def test_aggregation_match_and_group(mongo_db: Any) -> None:
    mongo_db.events.insert_many(
        [
            {"node": n, "code": c}
            for n, c in [("a", "XID-79"), ("a", "XID-13"), ("b", "XID-13"), ("a", "XID-13")]
        ]
    )
    rows = list(
        mongo_db.events.aggregate(
            [
                {"$match": {"code": "XID-13"}},
                {"$group": {"_id": "$node", "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert rows == [{"_id": "a", "n": 2}, {"_id": "b", "n": 1}]


def test_what_this_server_refuses(mongo_db: Any, mongo: Any) -> None:
    """TTL indexes, change streams and transactions: MongoDB accepts them, FerretDB v1 does not."""
    coll = mongo_db.events
    coll.insert_one({"x": 1})
    with pytest.raises(OperationFailure):
        coll.create_index("created_at", expireAfterSeconds=60)
    with pytest.raises(OperationFailure), coll.watch() as stream:
        stream.try_next()
    client = mongo_db.client
    with pytest.raises(OperationFailure), client.start_session() as session, session.start_transaction():
        coll.insert_one({"x": 2}, session=session)
