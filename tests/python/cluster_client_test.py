"""neardup from Python through each node of a cluster: every document inserted through one
node is found through every node, at its distance, and CheckAndInsert through a third node
sees them.

Run by tests/tests/cluster_data.rs with stubs generated from proto/ at test time:
    python3 cluster_client_test.py HOST:PORT HOST:PORT HOST:PORT
"""

import json
import sys

import grpc

from neardup.v1 import neardup_pb2 as pb
from neardup.v1 import neardup_pb2_grpc as rpc


# UNAVAILABLE is the API's "retry" (the cluster map moved during the request, as it does
# while replicas finish filling): the channels retry it, as a client's retry policy does.
RETRY = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "neardup.v1.Neardup"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def main(addrs):
    options = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY)]
    stubs = [rpc.NeardupStub(grpc.insecure_channel(a, options=options)) for a in addrs]
    base = 0x5A5A_1234_5678_9ABC
    docs = {}
    # Through node i: three documents, one of them near a document of the node before.
    for i, stub in enumerate(stubs):
        batch = [
            pb.Document(id=f"https://py-cluster/{i}/a", fingerprint=base ^ (1 << i), timestamp_ms=10 + i),
            pb.Document(id=f"https://py-cluster/{i}/b", fingerprint=(base * (i + 3)) & (2**64 - 1), timestamp_ms=20 + i),
            pb.Document(id=f"https://py-cluster/{i}/c", fingerprint=~base & (2**64 - 1) ^ (1 << (8 * i)), timestamp_ms=30 + i),
        ]
        r = stub.Insert(pb.InsertRequest(documents=batch), timeout=10)
        assert r.inserted == 3, (addrs[i], r)
        docs.update({d.id: d for d in batch})
    # Every document through every node, exactly, at k = 0 and near base at k = 3.
    for j, stub in enumerate(stubs):
        for d in docs.values():
            r = stub.Query(pb.QueryRequest(target=pb.QueryTarget(fingerprint=d.fingerprint), k=0, limit=10), timeout=10)
            got = [(m.id, m.fingerprint, m.distance, m.timestamp_ms) for m in r.result.matches]
            assert got == [(d.id, d.fingerprint, 0, d.timestamp_ms)], (addrs[j], d.id, got)
        r = stub.Query(pb.QueryRequest(target=pb.QueryTarget(fingerprint=base), k=3, limit=100), timeout=10)
        want = sorted(
            ((bin(d.fingerprint ^ base).count("1"), d.timestamp_ms, d.id) for d in docs.values() if bin(d.fingerprint ^ base).count("1") <= 3)
        )
        got = [(m.distance, m.timestamp_ms, m.id) for m in r.result.matches]
        assert got == want, (addrs[j], got, want)
    # An admission through each node sees the near-duplicates stored through the others.
    for j, stub in enumerate(stubs):
        r = stub.CheckAndInsert(
            pb.CheckAndInsertRequest(
                document=pb.Document(id=f"https://py-cluster/admit/{j}", fingerprint=base, timestamp_ms=100 + j),
                k=1,
                verify_jaccard=0.0,
            ),
            timeout=10,
        )
        near = {m.id for m in r.matches}
        assert r.duplicate and r.inserted, (addrs[j], r)
        assert {f"https://py-cluster/{i}/a" for i in range(len(stubs))} <= near, (addrs[j], near)
    print("python cluster client: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1:])
