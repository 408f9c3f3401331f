#!/usr/bin/env python3
"""gRPC peer for Remora's end-to-end tests, with Python's grpcio and raw-bytes methods (no
generated code).

  grpc_peer.py server PORT          serve /test.Echo/* until killed (or LIFETIME seconds)
  grpc_peer.py client HOST:PORT     run every call type through HOST:PORT; exit 0 if all pass
  grpc_peer.py down HOST:PORT       expect UNAVAILABLE from a proxy whose upstream is down
"""

import sys
import threading
import time
from concurrent import futures

import grpc

LIFETIME = 120
MIB = 1 << 20
BIG = 4 * MIB
OPTIONS = [
    ("grpc.max_send_message_length", 16 * MIB),
    ("grpc.max_receive_message_length", 16 * MIB),
]


def payload(size, seed):
    block = bytes((i * 31 + seed) % 251 for i in range(4096))
    return (block * (size // len(block) + 1))[:size]


def unary(request, context):
    if request.startswith(b"fail:"):
        context.set_trailing_metadata((("x-trailer", "yes"),))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "asked to fail")
    context.set_trailing_metadata((("x-trailer", "yes"),))
    return request


lock = threading.Lock()
# Slow calls that ended (cancelled, or past their deadline) before they were answered.
abandoned = 0


def slow(request, context):
    global abandoned
    end = time.monotonic() + 3
    while time.monotonic() < end:
        if not context.is_active():
            with lock:
                abandoned += 1
            return request
        time.sleep(0.02)
    return request


def abandoned_count(request, context):
    with lock:
        return str(abandoned).encode()


def client_stream(requests, context):
    total, count = 0, 0
    for r in requests:
        total += len(r)
        count += 1
    return f"{count} {total}".encode()


def server_stream(request, context):
    count, size = (int(x) for x in request.decode().split())
    for i in range(count):
        yield payload(size, i)


def bidi(requests, context):
    for r in requests:
        yield r


def serve(port):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=OPTIONS)
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Abandoned": grpc.unary_unary_rpc_method_handler(abandoned_count),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    server.wait_for_termination(timeout=LIFETIME)


def check(what, ok, detail=""):
    if not ok:
        print(f"FAIL {what}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def client(target):
    channel = grpc.insecure_channel(target, options=OPTIONS)
    grpc.channel_ready_future(channel).result(timeout=10)

    call = channel.unary_unary("/test.Echo/Unary")
    data = payload(BIG, 1)
    response, c = call.with_call(data, timeout=20)
    check("unary 4 MiB", response == data, f"{len(response)} bytes back")
    check("unary trailers", ("x-trailer", "yes") in c.trailing_metadata(), c.trailing_metadata())

    try:
        call(b"fail:please", timeout=10)
        check("error status", False, "no error")
    except grpc.RpcError as e:
        check("error status", e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code())
        check("error message", e.details() == "asked to fail", e.details())
        check("error trailers", ("x-trailer", "yes") in e.trailing_metadata(), e.trailing_metadata())

    messages = [payload(BIG, i) for i in range(3)]
    response = channel.stream_unary("/test.Echo/ClientStream")(iter(messages), timeout=30)
    check("client streaming", response == f"3 {3 * BIG}".encode(), response)

    got = list(channel.unary_stream("/test.Echo/ServerStream")(f"3 {BIG}".encode(), timeout=30))
    check("server streaming", got == [payload(BIG, i) for i in range(3)], [len(g) for g in got])

    messages = [payload(MIB, i) for i in range(8)]
    got = list(channel.stream_stream("/test.Echo/Bidi")(iter(messages), timeout=30))
    check("bidi streaming", got == messages, [len(g) for g in got])

    try:
        channel.unary_unary("/test.Echo/Slow")(b"x", timeout=0.5)
        check("deadline", False, "no error")
    except grpc.RpcError as e:
        check("deadline", e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.code())
    # The server's call ends with the deadline too, not 3 s later: the stream was cancelled
    # through the proxy.
    count = b"0"
    for _ in range(100):
        count = channel.unary_unary("/test.Echo/Abandoned")(b"", timeout=10)
        if count != b"0":
            break
        time.sleep(0.05)
    check("deadline cancels the server's call", count == b"1", count)


def down(target):
    channel = grpc.insecure_channel(target)
    try:
        channel.unary_unary("/test.Echo/Unary")(b"x", timeout=10)
        check("upstream down", False, "no error")
    except grpc.RpcError as e:
        check("upstream down is UNAVAILABLE", e.code() == grpc.StatusCode.UNAVAILABLE, e.code())
        # Written by the proxy, not by the client library failing to connect.
        check("from the proxy", "upstream connect error" in (e.details() or ""), e.details())


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    {"server": lambda: serve(int(arg)), "client": lambda: client(arg), "down": lambda: down(arg)}[mode]()
