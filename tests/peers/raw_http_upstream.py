"""An HTTP/1.1 upstream that answers each request with canned bytes chosen by its path,
including framings a proxy must refuse, then closes the connection (each answer says so, so
that no proxy sends another request on it). Usage:
raw_http_upstream.py ADDRESS PORT"""
import socket
import sys
import threading
import time

CANNED = {
    "/ok": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    "/204-length-0": b"HTTP/1.1 204 No Content\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    "/204-body": b"HTTP/1.1 204 No Content\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    "/204-chunked": b"HTTP/1.1 204 No Content\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "/304-chunked": b"HTTP/1.1 304 Not Modified\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
    "/length-and-chunked": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "/length-twice": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    "/lengths-differ": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    "/gzip-coded": b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: gzip\r\n\r\nok",
    "/no-status": b"garbage\r\n\r\n",
}


def serve(conn):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        path = data.split(b" ")[1].decode(errors="replace")
        conn.sendall(CANNED.get(path, b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
        time.sleep(0.2)
    finally:
        conn.close()


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((sys.argv[1], int(sys.argv[2])))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
