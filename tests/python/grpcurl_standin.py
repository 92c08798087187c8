"""A stand-in for `grpcurl -plaintext [-d JSON] ADDRESS SERVICE/METHOD` on unary calls of
neardup.v1, for machines without grpcurl (tests/tests/readme.rs runs the README's grpcurl
example through it). Like grpcurl it sends the request given as protobuf JSON and prints
the answer as protobuf JSON (camelCase names, 64-bit integers as strings, default values
left out, two-space indent).

    python3 grpcurl_standin.py -plaintext -d '{"k": 3}' 127.0.0.1:50051 neardup.v1.Neardup/Query

PYTHONPATH must hold the stubs generated from proto/neardup/v1/neardup.proto.
"""

import sys

import grpc
from google.protobuf import json_format, message_factory

from neardup.v1 import neardup_pb2 as pb


def main(argv):
    data, rest = "{}", []
    args = iter(argv)
    for a in args:
        if a == "-plaintext":
            continue
        if a == "-d":
            data = next(args)
        elif a.startswith("-"):
            sys.exit(f"grpcurl stand-in: option {a} is not supported")
        else:
            rest.append(a)
    if len(rest) != 2:
        sys.exit("grpcurl stand-in: usage: -plaintext [-d JSON] ADDRESS SERVICE/METHOD")
    address, method = rest
    service, name = method.rsplit("/", 1)
    if service != "neardup.v1.Neardup":
        sys.exit(f"grpcurl stand-in: only neardup.v1.Neardup, not {service}")
    desc = pb.DESCRIPTOR.services_by_name["Neardup"].methods_by_name[name]
    request = json_format.Parse(data, message_factory.GetMessageClass(desc.input_type)())
    reply_class = message_factory.GetMessageClass(desc.output_type)
    call = grpc.insecure_channel(address).unary_unary(
        f"/{service}/{name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=reply_class.FromString,
    )
    print(json_format.MessageToJson(call(request, timeout=30), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
