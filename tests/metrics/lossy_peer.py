"""Helper process for the retransmit test: a TCP pair on loopback that sends when told.

Run inside a private network namespace. Prints its pid and "ready" once connected, waits for a
line on stdin (the test breaks the loopback meanwhile), sends, and keeps the socket open long
enough for several retransmission timeouts before printing "done".
"""

import os
import socket
import sys
import time

listener = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(listener.getsockname())
server, _ = listener.accept()
print(os.getpid(), "ready", flush=True)
sys.stdin.readline()
client.setblocking(False)
client.send(b"x" * 4096)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
print("done", flush=True)
