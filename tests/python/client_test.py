"""neardup from Python: insert, query, check and the health check over grpcio.

Run by tests/tests/python_client.rs with stubs generated from proto/ at test time:
    python3 client_test.py HOST:PORT   (PYTHONPATH holds the generated neardup/v1 stubs)
"""

import sys

import grpc

from neardup.v1 import neardup_pb2 as pb
from neardup.v1 import neardup_pb2_grpc as rpc


def health(channel, service=""):
    """grpc.health.v1.Health/Check without extra packages: encode and decode by hand."""
    name = service.encode()
    request = (b"\x0a" + bytes([len(name)]) + name) if name else b""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    reply = check(request, timeout=10)
    # HealthCheckResponse { status = 1 (varint) }; SERVING is 1.
    return reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0


def main(addr):
    channel = grpc.insecure_channel(addr)
    stub = rpc.NeardupStub(channel)

    assert health(channel) == 1, "server not SERVING"
    assert health(channel, "neardup.v1.Neardup") == 1

    base = 0x0F0F_1234_5678_9ABC
    docs = [
        pb.Document(id="https://py/1", fingerprint=base, timestamp_ms=10),
        pb.Document(id="https://py/2", fingerprint=base ^ 0b11, timestamp_ms=20),
        pb.Document(id="https://py/far", fingerprint=base ^ 0xFFFF_0000_0000_0000, timestamp_ms=30),
        pb.Document(id="https://py/text", text="Python speaks gRPC to neardup over loopback.", timestamp_ms=40),
    ]
    r = stub.Insert(pb.InsertRequest(documents=docs), timeout=10)
    assert (r.inserted, r.replaced) == (4, 0), r

    r = stub.Query(pb.QueryRequest(target=pb.QueryTarget(fingerprint=base ^ 0b1), k=3, limit=10), timeout=10)
    got = [(m.id, m.distance) for m in r.result.matches]
    assert got == [("https://py/1", 1), ("https://py/2", 1)], got

    r = stub.Query(pb.QueryRequest(target=pb.QueryTarget(text="PYTHON speaks gRPC, to neardup over loopback!")), timeout=10)
    assert [m.id for m in r.result.matches][:1] == ["https://py/text"], r

    r = stub.CheckAndInsert(
        pb.CheckAndInsertRequest(
            document=pb.Document(id="https://py/3", fingerprint=base ^ 0b100, timestamp_ms=50),
            k=3,
        ),
        timeout=10,
    )
    assert r.duplicate and r.inserted and r.original_id == "https://py/1", r
    assert {m.id for m in r.matches} == {"https://py/1", "https://py/2"}, r

    try:
        stub.Query(pb.QueryRequest(target=pb.QueryTarget(fingerprint=1), k=99), timeout=10)
        raise AssertionError("k=99 was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e

    s = stub.Stats(pb.StatsRequest(), timeout=10)
    assert s.documents == 5 and s.max_k == 6 and s.design == "8c2", s
    print("python client: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
